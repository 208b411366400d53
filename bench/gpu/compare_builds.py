#!/usr/bin/env python3
"""Compares the GPU rows of campaigns of two builds run in the same device call.

Usage: compare_builds.py --before A1.jsonl A2.jsonl --after B1.jsonl B2.jsonl [--tolerance 0.03] [--svg FILE]

Each file is a campaign's results.jsonl (`topk_bench campaign --out DIR`).
For every GPU configuration (backend cuda, paths resident and device, every
n, d, k and batch) it prints the median of each run, the spread of the two
runs of each build (|r1 - r2| / min), and the ratio of the builds (mean of
the after medians / mean of the before medians). A configuration regresses
when the ratio exceeds 1 + tolerance + the larger of the two spreads.
Exit status 1 when any configuration regresses or a configuration is missing
from a run.
"""

import argparse
import json
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if r.get("backend") != "cuda" or r.get("path") not in ("resident", "device"):
                continue
            if r.get("error") or r.get("median_ms") is None:
                continue
            key = (r["path"], r["n"], r["d"], r["k"], r["batch"])
            rows[key] = r["median_ms"]
    return rows


def spread(a, b):
    return abs(a - b) / min(a, b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", nargs=2, required=True)
    ap.add_argument("--after", nargs=2, required=True)
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--svg", help="also draw after/before per configuration, with each limit, into this SVG file")
    args = ap.parse_args()
    b1, b2 = (load(p) for p in args.before)
    a1, a2 = (load(p) for p in args.after)
    keys = sorted(set(b1) | set(b2) | set(a1) | set(a2))
    missing = [k for k in keys if not all(k in r for r in (b1, b2, a1, a2))]
    print("| path | n | d | k | batch | before ms | before spread | after ms | after spread | after/before | verdict |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    worst, regressions, ratios, points = None, [], [], []
    for k in keys:
        if k in missing:
            continue
        bm = (b1[k] + b2[k]) / 2
        am = (a1[k] + a2[k]) / 2
        sb, sa = spread(b1[k], b2[k]), spread(a1[k], a2[k])
        ratio = am / bm
        ratios.append(ratio)
        limit = 1 + args.tolerance + max(sb, sa)
        points.append((k, ratio, limit))
        bad = ratio > limit
        if bad:
            regressions.append(k)
        if worst is None or ratio - limit > worst[0]:
            worst = (ratio - limit, k, ratio, limit)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | {bm:.4f} | {sb:.1%} | {am:.4f} | {sa:.1%} | {ratio:.3f} | {'SLOWER' if bad else 'ok'} |")
    ratios.sort()
    med = ratios[len(ratios) // 2] if ratios else float("nan")
    print()
    print(f"configurations compared: {len(ratios)}; median after/before {med:.3f}; "
          f"regressions beyond {args.tolerance:.0%} + spread: {len(regressions)}; missing: {len(missing)}")
    if worst:
        print(f"closest to the limit: {worst[1]} ratio {worst[2]:.3f} (limit {worst[3]:.3f})")
    for k in missing:
        print(f"missing in a run: {k}")
    if args.svg:
        draw(points, args.svg)
    return 1 if regressions or missing else 0


def draw(points, path):
    """One mark per configuration (x: its place in the table), its ratio
    (filled: within its limit; red: beyond) and its limit (a short dash)."""
    w, h, left, top, bottom = 900, 360, 60, 30, 40
    lo, hi = 0.85, 1.20
    y = lambda r: top + (hi - min(max(r, lo), hi)) / (hi - lo) * (h - top - bottom)
    x = lambda i: left + (i + 0.5) * (w - left - 20) / max(len(points), 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left}" y="18">after / before median time per GPU configuration (lower is faster); dash: 1 + tolerance + spread</text>']
    for r in (0.9, 1.0, 1.1, 1.2):
        out.append(f'<line x1="{left}" x2="{w - 20}" y1="{y(r):.1f}" y2="{y(r):.1f}" stroke="#ccc"/>')
        out.append(f'<text x="{left - 8}" y="{y(r) + 4:.1f}" text-anchor="end">{r:.1f}</text>')
    for i, (k, ratio, limit) in enumerate(points):
        colour = "#c00" if ratio > limit else "#246"
        out.append(f'<line x1="{x(i) - 2:.1f}" x2="{x(i) + 2:.1f}" y1="{y(limit):.1f}" y2="{y(limit):.1f}" stroke="#999"/>')
        out.append(f'<circle cx="{x(i):.1f}" cy="{y(ratio):.1f}" r="2.2" fill="{colour}"><title>{k}: {ratio:.3f} (limit {limit:.3f})</title></circle>')
    out.append(f'<text x="{left}" y="{h - 12}">{len(points)} configurations: path, n, d, k, batch in table order</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    sys.exit(main())
