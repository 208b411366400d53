"""Tables and a plot of one cuda lifecycle run: gpu_lifecycle's JSON lines
beside the torch anchors' (bench/gpu/lifecycle_anchors.py), as ratios.

python3 lifecycle_table.py lifecycle.jsonl anchors.jsonl OUT_DIR
writes OUT_DIR/table.md, OUT_DIR/filtered.png and OUT_DIR/filtered.svg.
"""

import json
import sys
from pathlib import Path


def load(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def ms(s):
    return f"{s * 1e3:.3f}"


def main():
    ours, anchors, out = load(sys.argv[1]), load(sys.argv[2]), Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    lines = []

    def find(rows, **kw):
        for r in rows:
            if all(r.get(k) == v for k, v in kw.items()):
                return r
        return None

    h2d = {r["what"]: r for r in anchors if r["what"].startswith("h2d")}
    pageable = h2d.get("h2d pageable (torch .to(cuda))")
    pinned = h2d.get("h2d pinned (torch .to(cuda, non_blocking))")
    lines += [
        "## Mutations",
        "",
        "| step | rows | time (ms) | GB/s | × torch pinned H2D | × torch pageable H2D |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in ours:
        if r["what"].startswith(("add", "build", "remove", "compact")):
            rows = r.get("rows", "")
            gbs = f"{r['bytes'] / r['s'] / 1e9:.1f}" if "bytes" in r else ""
            vs_pin = vs_page = ""
            if r["what"].startswith("add") and pinned and pageable and r.get("rows") == pinned["rows"]:
                vs_pin = f"{r['s'] / pinned['s']:.2f}"
                vs_page = f"{r['s'] / pageable['s']:.2f}"
            lines.append(f"| {r['what']} | {rows} | {ms(r['s'])} | {gbs} | {vs_pin} | {vs_page} |")
    if pinned and pageable:
        for r in (pinned, pageable):
            lines.append(
                f"| {r['what']} | {r['rows']} | {ms(r['s'])} | {r['bytes'] / r['s'] / 1e9:.1f} | | |"
            )
    lines += [""]

    lines += [
        "## Filtered search (K = 100)",
        "",
        "| queries | allowed | topk (ms) | × topk unfiltered | torch masked (ms) | torch gathered (ms) | topk / best torch |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    plot = {}
    for r in ours:
        if r["what"] != "search":
            continue
        nq, pm = r["queries"], r["allowed_permille"]
        m = find(anchors, what="torch masked", queries=nq, allowed_permille=pm)
        g = find(anchors, what="torch gathered", queries=nq, allowed_permille=pm)
        best = min(x["s"] for x in (m, g) if x) if (m or g) else None
        lines.append(
            f"| {nq} | {pm / 10:g} % | {ms(r['s'])} | {r['ratio']:.2f} | "
            f"{ms(m['s']) if m else ''} | {ms(g['s']) if g else ''} | "
            f"{r['s'] / best:.2f} |" if best else "|"
        )
        plot.setdefault(nq, []).append((pm / 10, r["s"], m["s"] if m else None, g["s"] if g else None))
    for nq in sorted({r["queries"] for r in ours if r["what"] == "search unfiltered"}):
        u = find(ours, what="search unfiltered", queries=nq)
        t = find(anchors, what="torch unfiltered", queries=nq)
        lines.append(
            f"| {nq} | unfiltered | {ms(u['s'])} | 1.00 | {ms(t['s']) if t else ''} (plain) | | "
            f"{u['s'] / t['s']:.2f} |" if t else ""
        )
    lines += [""]

    lines += ["## Save and open", "", "| step | bytes | time (ms) | GB/s |", "| --- | ---: | ---: | ---: |"]
    for r in ours:
        if r["what"].startswith(("save", "open", "raw")):
            lines.append(f"| {r['what']} | {r['bytes']} | {ms(r['s'])} | {r['bytes'] / r['s'] / 1e9:.2f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(plot), figsize=(5.5 * len(plot), 4), squeeze=False)
    for ax, (nq, pts) in zip(axes[0], sorted(plot.items())):
        pts.sort()
        x = [p[0] for p in pts]
        ax.plot(x, [p[1] * 1e3 for p in pts], "o-", label="topk cuda (exact)")
        ax.plot(x, [p[2] * 1e3 for p in pts], "s--", label="torch masked")
        ax.plot(x, [p[3] * 1e3 for p in pts], "^--", label="torch gathered")
        u = find(ours, what="search unfiltered", queries=nq)
        if u:
            ax.axhline(u["s"] * 1e3, color="gray", lw=0.8, label="topk unfiltered")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("allowed rows (%)")
        ax.set_ylabel("time per call (ms)")
        ax.set_title(f"{nq} quer{'y' if nq == 1 else 'ies'}, K = 100, 1M x 1024")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "filtered.png", dpi=110)
    fig.savefig(out / "filtered.svg")


if __name__ == "__main__":
    main()
