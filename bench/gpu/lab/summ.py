"""Prints a cuda_probe JSON-lines file as one line per measurement.

Usage: python3 bench/gpu/lab/summ.py probe.jsonl
Each single-query line shows fuse_rows, N, D, K, the host and device-query
medians, the floor, host minus floor, correctness and the stage times (µs).
"""
import json
import sys

for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if r.get("kind") == "single":
        stages = {k: round(v * 1e3, 1) for k, v in r["stages_ms"].items()}
        print(r.get("fuse_rows"), r["n"], r["d"], r["k"],
              "host %.1f dev %.1f floor %.1f over %.1f ok %s" % (
                  r["host_median_ms"] * 1e3, r["device_median_ms"] * 1e3,
                  r["floor_ms"] * 1e3, r["host_minus_floor_us"], r["correct"]),
              stages)
    elif r.get("kind") == "batch":
        print(r)
