"""Q = 256, K = 100 over the campaign grid: topk's exact batches from host
queries and from device queries (`cuda_probe --device-batches`, files
`*.jsonl` of a results folder) against torch (`scale_anchors.py`, files
`torch-*.jsonl`), as speed over torch (torch's time / topk's). Device
queries are set against torch timed with CUDA events over data already on
the device; host queries against torch on the host clock with the queries
copied from pinned host memory and the answers copied back. Each point is
the mean of the runs' medians. Writes table.md and grid.png / grid.svg into
the folder.

Usage: python3 bench/gpu/plot_grid.py RESULTS_DIR "H100" (matplotlib)."""

import json
import sys
from pathlib import Path
from statistics import mean

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = Path(sys.argv[1])
card = sys.argv[2] if len(sys.argv) > 2 else "GPU"
ours: dict = {}
for f in sorted(here.glob("*.jsonl")):
    if f.name.startswith("torch"):
        continue
    for line in f.read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "batch":
            assert r["correct"], f"{f}: an answer differed from the reference"
            ours.setdefault((r["queries"], r["n"], r["d"]), []).append(r["median_ms"])
torch: dict = {}
for f in sorted(here.glob("torch-*.jsonl")):
    for line in f.read_text().splitlines():
        r = json.loads(line)
        for key in ("fp32", "tf32", "bf16", "fp32_host", "tf32_host"):
            torch.setdefault((key, r["n"], r["d"]), []).append(r[f"batch_{key}_ms"])


def span(v):
    return f"{min(v):.3f}" if len(v) == 1 else f"{min(v):.3f}-{max(v):.3f}"


ns = sorted({k[1] for k in ours})
ds = sorted({k[2] for k in ours})
rows = [
    (
        "| N x D | topk host queries | topk device queries | torch fp32 | TF32 | bf16 "
        "| torch fp32, host clock | TF32, host clock |"
    ),
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
]
for n in ns:
    for d in ds:
        cells = [span(ours[("host", n, d)]), span(ours[("device", n, d)])]
        cells += [
            span(torch[(k, n, d)])
            for k in ("fp32", "tf32", "bf16", "fp32_host", "tf32_host")
        ]
        rows.append(f"| {n // 1000}k x {d} | " + " | ".join(cells) + " |")
(here / "table.md").write_text("\n".join(rows) + "\n")

fig, axes = plt.subplots(1, len(ds), figsize=(15, 4.4), sharey=True)
lines = [
    ("device queries / torch TF32 (events)", "device", "tf32", "#1f77b4", "-"),
    ("host queries / torch TF32 (host clock)", "host", "tf32_host", "#1f77b4", "--"),
    ("device queries / torch fp32 (events)", "device", "fp32", "#7f7f7f", "-"),
    ("host queries / torch fp32 (host clock)", "host", "fp32_host", "#7f7f7f", "--"),
    ("device queries / torch bf16 (events)", "device", "bf16", "#d62728", "-"),
]
for ax, d in zip(axes, ds):
    for label, src, key, color, style in lines:
        ys = [mean(torch[(key, n, d)]) / mean(ours[(src, n, d)]) for n in ns]
        ax.plot(ns, ys, style, marker="o", color=color, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("corpus rows N")
    ax.set_title(f"D = {d}, Q = 256, K = 100")
axes[0].set_ylabel("speed over torch (>1: topk faster)")
axes[0].legend(fontsize=8)
fig.suptitle(f"{card}: exact topk batches against torch (not exact)")
fig.tight_layout()
fig.savefig(here / "grid.png", dpi=110)
fig.savefig(here / "grid.svg")
