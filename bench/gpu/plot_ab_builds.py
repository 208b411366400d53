"""Bar chart of a side-by-side build comparison from cuda_probe batch records.

Reads a JSONL file whose batch records carry a "build" field (the call that
made it prefixes each record with the build's name) and draws, for each
(N, D, Q) shape, the median time of every build for host and device queries:
the mean of the rounds, with the rounds as dots.

Usage: python3 plot_ab_builds.py RESULTS.jsonl OUT_STEM [BUILD ...]
(writes OUT_STEM.png and OUT_STEM.svg; builds in the given order, default
the order in which they first appear).
"""

from __future__ import annotations

import collections
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> None:
    path, stem = sys.argv[1], sys.argv[2]
    times: dict[tuple, list[float]] = collections.defaultdict(list)
    order: list[str] = list(sys.argv[3:])
    with open(path) as f:
        records = [json.loads(line) for line in f]
    for r in records:
        if r.get("kind") != "batch":
            continue
        if r["build"] not in order:
            order.append(r["build"])
        key = (r["q"], r["queries"], r["n"], r["d"], r["build"])
        times[key].append(r["median_ms"] * 1000.0)
    qs = sorted({k[0] for k in times})
    sources = sorted({k[1] for k in times})
    shapes = sorted({(k[2], k[3]) for k in times})
    fig, axes = plt.subplots(
        len(qs), len(sources), figsize=(13, 4 * len(qs)), squeeze=False
    )
    width = 0.8 / len(order)
    for i, q in enumerate(qs):
        for j, src in enumerate(sources):
            ax = axes[i][j]
            for b, build in enumerate(order):
                xs, ys = [], []
                for s, (n, d) in enumerate(shapes):
                    v = times.get((q, src, n, d, build), [])
                    if not v:
                        continue
                    x = s + (b - (len(order) - 1) / 2) * width
                    xs.append(x)
                    ys.append(sum(v) / len(v))
                    ax.plot([x] * len(v), v, "k.", markersize=2)
                ax.bar(xs, ys, width, label=build)
            ax.set_xticks(range(len(shapes)))
            ax.set_xticklabels([f"{n // 1000}k×{d}" for n, d in shapes], rotation=45)
            ax.set_ylabel("median µs per batch")
            ax.set_title(f"Q = {q}, {src} queries")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{stem}.png", dpi=110)
    fig.savefig(f"{stem}.svg")


if __name__ == "__main__":
    main()
