"""Prints a trace_lab JSON-lines file as one line per configuration.

Usage: python3 bench/gpu/lab/trace_summ.py trace.jsonl
Each line shows the run, N, D, K, the event time, correctness, the ranking's
time (mark 6 minus mark 5, or minus mark 3 where the keys never left shared
memory) and every mark's median in µs from the kernel's entry (see the marks
in trace_lab.cu).
"""
import json
import sys

ORDER = ["0", "1", "8", "9", "2", "3", "4", "5", "10", "11", "12", "6", "7"]

for line in open(sys.argv[1]):
    r = json.loads(line)
    m = r["marks_us"]
    marks = " ".join(f"{k}:{m[k][0]:.1f}" for k in ORDER if k in m)
    rank = m["6"][0] - m["5" if "5" in m else "3"][0]
    print(f"{r['kind']:12s} {r['n']:7d} {r['d']:5d} {r['k']:5d} event {r['event_us']:6.1f} "
          f"ok {r['correct']} rank {rank:4.1f} | {marks}")
