"""How many rows per query the filtered batch path lists on a real corpus.

Emulates kernels/filter.cu's bounds on the host side of a GPU machine (torch,
float64): inputs rounded to TF32 (to nearest, ties away), products summed in
float64 (closer to exact than the tensor cores, so the window is the same
width and the listed rows are what the engine lists up to the few rows that
sit on its edge), the half-width w of topk_approx_width for dot products, T
the K-th largest lower bound, and the rows whose upper bound reaches T.

Usage: python3 filter_window.py CORPUS.npy QUERIES.npy
Prints one JSON line per K: listed rows per query (median, 99th percentile,
max) and how many queries list more than the device's 4,096.
"""
import json
import sys

import numpy as np
import torch


def tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 to TF32, round to nearest with ties away from zero (cvt.rna)."""
    bits = x.contiguous().view(torch.int32)
    rounded = (bits + 0x1000) & ~0x1FFF
    return rounded.view(torch.float32)


def main() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.from_numpy(np.load(sys.argv[1])).to(dev)
    q = torch.from_numpy(np.load(sys.argv[2])).to(dev)
    n, d = x.shape
    rn = x.double().norm(dim=1)
    qn = q.double().norm(dim=1)
    a = tf32(q).double() @ tf32(x).double().T
    e = 2.0**-8 + d * 2.0**-22
    w = e * qn[:, None] * rn[None, :] + 2.0**-100 * (qn[:, None] + rn[None, :] + 1)
    lower = a - w
    upper = a + w
    for k in (10, 100, 1000):
        t = lower.topk(k, dim=1).values[:, -1:]
        listed = (upper >= t).sum(dim=1).float().cpu()
        print(json.dumps({"n": n, "d": d, "queries": q.shape[0], "k": k,
                          "listed_median": float(listed.median()),
                          "listed_p99": float(listed.quantile(0.99)),
                          "listed_max": float(listed.max()),
                          "queries_over_4096": int((listed > 4096).sum())}))


if __name__ == "__main__":
    main()
