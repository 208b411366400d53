"""How many rows per query the filtered batch path lists on a real corpus.

Emulates the bounds of kernels/filter.cu with numpy in float64: inputs
rounded to TF32 (to nearest, ties away from zero, as cvt.rna), products
summed in float64 (closer to exact than the tensor cores; the window has the
same width, so the rows listed are the engine's up to the few on its edge),
the half-width w of topk_approx_width for dot products, T the K-th largest
lower bound, and the rows whose upper bound reaches T.

Usage: python3 filter_window.py CORPUS.npy QUERIES.npy
Prints one JSON line per K: rows listed per query (median, 99th percentile,
max) and how many queries list more than the 4,096 a query may list on the
device (those chunks run again on the canonical path).
"""
import json
import sys

import numpy as np


def tf32(x: np.ndarray) -> np.ndarray:
    """fp32 to TF32, round to nearest with ties away from zero (cvt.rna)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return rounded.view(np.float32)


def main() -> None:
    x = np.load(sys.argv[1]).astype(np.float32)
    q = np.load(sys.argv[2]).astype(np.float32)
    n, d = x.shape
    rn = np.linalg.norm(x.astype(np.float64), axis=1)
    qn = np.linalg.norm(q.astype(np.float64), axis=1)
    a = tf32(q).astype(np.float64) @ tf32(x).astype(np.float64).T
    e = 2.0**-8 + d * 2.0**-22
    w = e * qn[:, None] * rn[None, :] + 2.0**-100 * (qn[:, None] + rn[None, :] + 1)
    lower = a - w
    upper = a + w
    for k in (10, 100, 1000):
        t = -np.partition(-lower, k - 1, axis=1)[:, k - 1 : k]
        listed = (upper >= t).sum(axis=1)
        print(
            json.dumps(
                {
                    "n": n,
                    "d": d,
                    "queries": int(q.shape[0]),
                    "k": k,
                    "listed_median": float(np.median(listed)),
                    "listed_p99": float(np.quantile(listed, 0.99)),
                    "listed_max": int(listed.max()),
                    "queries_over_4096": int((listed > 4096).sum()),
                }
            )
        )


if __name__ == "__main__":
    main()
