"""What a Python ``search`` of one float32 query costs beyond the Rust call.

Builds a cpu Index of N x D Gaussian rows, then alternates one call of the
Rust ``Index::search`` timed inside the extension and one of ``idx.search``
timed from Python (both one query, K), ROUNDS x 200 times, and prints the
medians and their difference as one JSON line. Use a release build of the package
(``maturin build --release`` and install the wheel).

    python crates/topk-py/bench/python_overhead.py [N] [D] [K] [ROUNDS]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

import topk


def main() -> None:
    given = [int(a) for a in sys.argv[1:]]
    n, d, k, rounds = given + [10_000, 384, 10, 20][len(given) :]
    rng = np.random.default_rng(1)
    idx = topk.Index(d, metric="cosine", backend="cpu")
    idx.add(rng.standard_normal((n, d), dtype=np.float32))
    q = rng.standard_normal(d, dtype=np.float32)
    rust: list[int] = []
    python: list[int] = []
    # One call of each in turn, so that both see the same caches, the same
    # rayon wake-ups and the same load of the machine.
    for _ in range(rounds * 200):
        rust += idx._time_rust_search(q, k, 1)
        t = time.perf_counter_ns()
        idx.search(q, k)
        python.append(time.perf_counter_ns() - t)
    r, p = statistics.median(rust) / 1e3, statistics.median(python) / 1e3
    print(
        json.dumps(
            {
                "n": n,
                "d": d,
                "k": k,
                "calls": len(python),
                "rust_median_us": round(r, 2),
                "python_median_us": round(p, 2),
                "overhead_us": round(p - r, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
