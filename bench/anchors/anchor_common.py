"""Shared pieces of the benchmark anchors: the manifest written by
`topk_bench campaign` / `topk_bench cpu-compare`, the statistics, and the
result record (the same JSON schema as topk_bench's own lines)."""

import json
import math
import os


def load_manifest(data_dir):
    """The data folder's manifest: files per D and the configurations to time."""
    with open(os.path.join(data_dir, "manifest.json")) as f:
        m = json.load(f)
    # JSON object keys are strings; the dimensions are integers.
    m["corpus"] = {int(d): name for d, name in m["corpus"].items()}
    m["queries"] = {int(d): name for d, name in m["queries"].items()}
    return m


def summary(times_ms):
    """Median, min, max and nearest-rank p90 of trial times (as topk_bench computes them)."""
    v = sorted(times_ms)
    n = len(v)
    median = v[n // 2] if n % 2 == 1 else (v[n // 2 - 1] + v[n // 2]) / 2.0
    rank = min(max(math.ceil(0.9 * n), 1), n)
    return {"median_ms": median, "min_ms": v[0], "max_ms": v[-1], "p90_ms": v[rank - 1]}


def record(cfg, manifest, backend, path, times_ms, **extra):
    """One result line: the fields of topk_bench's records, `correct` null
    (an anchor sums in another order, so it cannot be bit-exact)."""
    s = summary(times_ms)
    r = {
        "n": cfg["n"],
        "d": cfg["d"],
        "k": cfg["k"],
        "batch": cfg["batch"],
        "metric": manifest.get("metric", "dot"),
        "backend": backend,
        "path": path,
        "trials": len(times_ms),
        "warmup": cfg["warmup"],
        "seed": manifest["seed"],
        **s,
        "correct": None,
        "floor_ms": None,
        "bandwidth_gbs": None,
        "qps": cfg["batch"] / (s["median_ms"] / 1e3) if s["median_ms"] > 0 else None,
        "gate": None,
        "data": manifest["corpus"][cfg["d"]],
        "error": None,
    }
    r.update(extra)
    return r


def emit(out, rec):
    """Writes a record to the results file (flushed) and echoes it on stdout."""
    line = json.dumps(rec)
    out.write(line + "\n")
    out.flush()
    print("TOPK_BENCH_JSON " + line, flush=True)


def configs_by_d(manifest):
    """The manifest's configurations grouped by D, each group sorted by (n, batch, k)."""
    groups = {}
    for c in manifest["configs"]:
        groups.setdefault(c["d"], []).append(c)
    for d in groups:
        groups[d].sort(key=lambda c: (c["n"], c["batch"], c["k"]))
    return dict(sorted(groups.items()))
