"""Compares builds (or options) measured by cuda_probe in one device call.

Usage: python3 bench/gpu/lab/probe_ab.py DIR NAME... 
reads DIR/probe-NAME-1.jsonl and DIR/probe-NAME-2.jsonl for each NAME (two
runs each, taken in turn) and prints, per configuration, each one's host
and device query minus the floor (µs), then how many configurations each
run kept within floor + 25 µs and the host-minus-device gap at N <= 100k.
"""
import json
import statistics
import sys


def load(path):
    rows = {}
    for line in open(path):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r.get("kind") == "single":
            rows[(r["n"], r["d"], r["k"])] = (r["host_median_ms"] * 1e3,
                                              r["device_median_ms"] * 1e3,
                                              r["correct"], r["floor_ms"] * 1e3)
    return rows


d, names = sys.argv[1], sys.argv[2:]
runs = {b: [load(f"{d}/probe-{b}-{i}.jsonl") for i in (1, 2)] for b in names}
met = {b: [0, 0] for b in names}
gap = {b: [] for b in names}
for key in sorted(runs[names[0]][0]):
    floor = runs[names[0]][0][key][3]
    out = f"{key}"
    for b in names:
        host = [r[key][0] for r in runs[b]]
        dev = [r[key][1] for r in runs[b]]
        for i in range(2):
            met[b][i] += host[i] - floor <= 25
        if key[0] <= 100_000:
            gap[b] += [host[i] - dev[i] for i in range(2)]
        out += f"  {b} {host[0] - floor:5.1f} {host[1] - floor:5.1f}"
        out += f" (dev {dev[0] - floor:5.1f} {dev[1] - floor:5.1f})"
    print(out, all(r[key][2] for b in names for r in runs[b]))
print("within floor + 25 µs:", met)
for b in names:
    g = gap[b]
    print(f"{b}: host - device at N <= 100k: median {statistics.median(g):.1f}, "
          f"{min(g):.1f} to {max(g):.1f} µs")
