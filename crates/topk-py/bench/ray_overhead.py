"""What a search through ``topk.ray`` costs against one in-process ``topk.Index``.

For each corpus size N (D = 384, cosine, Gaussian rows) it builds one
in-process ``topk.Index`` and two ``topk.ray.ShardedIndex`` sets over the
same rows (1 shard and 3 shards, CPU actors on a local Ray instance), checks
that they return the same bytes, then times ``search`` of Q = 1 (one 1-D
query), 16 and 256 queries at K = 10, the three setups taking turns call by
call so that they see the same machine load. It also times a bare actor call
(``len`` of a 1-shard set: one RPC, no search), the floor of any Ray call.
Prints a markdown table and writes it, with the raw medians and p90s as JSON,
to ``--out`` (file names carry the sizes). Use a release build of the package (``maturin develop
--release``).

    python crates/topk-py/bench/ray_overhead.py --sizes 100000,1000000 \\
        --out bench/results/cpu-2core/2026-12-01-ray
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

import topk
import topk.ray

try:
    from tqdm import tqdm
except ImportError:  # plain prints instead
    tqdm = None

D = 384
K = 10
CHUNK = 50_000


def say(message: str) -> None:
    print(message, flush=True)


def percentile(values: list[float], p: float) -> float:
    return float(np.percentile(np.array(values), p))


def build(n: int, rng: np.random.Generator) -> dict[str, Any]:
    """The three setups over the same n rows, added in chunks."""
    local = topk.Index(D, metric="cosine", backend="cpu")
    one = topk.ray.ShardedIndex(D, metric="cosine", shards=1, num_cpus=0)
    three = topk.ray.ShardedIndex(D, metric="cosine", shards=3, num_cpus=0)
    chunks = range(0, n, CHUNK)
    bar = tqdm(chunks, desc=f"adding {n:,} rows", unit="chunk") if tqdm else chunks
    for start in bar:
        rows = rng.standard_normal((min(CHUNK, n - start), D), dtype=np.float32)
        for idx in (local, one, three):
            idx.add(rows)
        if tqdm is None:
            say(f"  added {start + len(rows):,} / {n:,} rows")
    return {"topk.Index": local, "ShardedIndex 1 shard": one, "ShardedIndex 3 shards": three}


def time_searches(
    setups: dict[str, Any], q: np.ndarray, budget_s: float, max_calls: int, gap_s: float
) -> dict[str, list[float]]:
    """Milliseconds of each call, the setups taking turns, until every setup
    has ``max_calls`` calls or the round-robin has run ``budget_s`` (at
    least 3 calls each). ``gap_s`` of sleep before each call lets the
    previous search's rayon workers (which spin a while after a parallel
    search) go idle, so that one setup's search does not slow the next's."""
    times: dict[str, list[float]] = {name: [] for name in setups}
    for idx in setups.values():  # warm-up
        idx.search(q, K)
    start = time.perf_counter()
    calls = 0
    while calls < max_calls and (calls < 3 or time.perf_counter() - start < budget_s):
        for name, idx in setups.items():
            time.sleep(gap_s)
            t = time.perf_counter_ns()
            idx.search(q, K)
            times[name].append((time.perf_counter_ns() - t) / 1e6)
        calls += 1
    return times


def rpc_floor(index: topk.ray.ShardedIndex, calls: int = 300) -> list[float]:
    out = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        len(index)
        out.append((time.perf_counter_ns() - t) / 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000", help="corpus sizes N, comma-separated")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per cell, at most")
    parser.add_argument("--calls", type=int, default=200, help="calls per setup per cell, at most")
    parser.add_argument("--batches", default="1,16,256", help="query counts Q, comma-separated")
    parser.add_argument(
        "--worker-niceness",
        type=int,
        default=None,
        help="Ray's worker_niceness (its default, 15, lowers the actors' CPU share under load)",
    )
    parser.add_argument("--gap-ms", type=float, default=20.0, help="sleep before each call (ms)")
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for results-<sizes>.json / table-<sizes>.md"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    system = {} if args.worker_niceness is None else {"worker_niceness": args.worker_niceness}
    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        _system_config=system,
    )
    rng = np.random.default_rng(7)
    records = []
    floors = []
    for n in sizes:
        setups = build(n, rng)
        # The setups must agree to the bit before their times mean anything.
        check = rng.standard_normal((4, D), dtype=np.float32)
        want = setups["topk.Index"].search(check, K)
        for name, idx in setups.items():
            got = idx.search(check, K)
            assert np.array_equal(got[0].view(np.uint32), want[0].view(np.uint32)), name
            assert np.array_equal(got[1], want[1]), name
        floor = rpc_floor(setups["ShardedIndex 1 shard"])
        floors.append(
            {"n": n, "median_ms": statistics.median(floor), "p90_ms": percentile(floor, 90)}
        )
        for nq in batches:
            q = rng.standard_normal(D if nq == 1 else (nq, D), dtype=np.float32)
            say(f"N = {n:,}, Q = {nq}: timing")
            times = time_searches(setups, q, args.budget, args.calls, args.gap_ms / 1e3)
            for name, ms in times.items():
                records.append(
                    {
                        "n": n,
                        "d": D,
                        "k": K,
                        "q": nq,
                        "setup": name,
                        "calls": len(ms),
                        "median_ms": statistics.median(ms),
                        "p90_ms": percentile(ms, 90),
                    }
                )
                median, p90 = statistics.median(ms), percentile(ms, 90)
                say(f"  {name:24} median {median:9.3f} ms  p90 {p90:9.3f} ms  ({len(ms)} calls)")
        for idx in setups.values():
            if isinstance(idx, topk.ray.ShardedIndex):
                idx.close()
        del setups
    ray.shutdown()

    table = render(records, floors)
    say(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "numpy": np.__version__,
            "load_average_at_end": os.getloadavg(),
            "gap_ms": args.gap_ms,
            "worker_niceness": args.worker_niceness if args.worker_niceness is not None else 15,
        }
        name = "-".join(str(n) for n in sizes) + f"-q{'-'.join(map(str, batches))}"
        if args.worker_niceness is not None:
            name += f"-nice{args.worker_niceness}"
        (args.out / f"results-{name}.json").write_text(
            json.dumps({"meta": meta, "rpc_floor": floors, "search": records}, indent=2) + "\n"
        )
        (args.out / f"table-{name}.md").write_text(table + "\n")


def render(records: list[dict[str, Any]], floors: list[dict[str, Any]]) -> str:
    """The markdown table: each setup's median and p90, and the median's
    ratio to the in-process index."""
    lines = [
        "| N x D | Q | setup | median ms | p90 ms | median / topk.Index | calls |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    base = {(r["n"], r["q"]): r["median_ms"] for r in records if r["setup"] == "topk.Index"}
    for r in records:
        ratio = r["median_ms"] / base[(r["n"], r["q"])]
        lines.append(
            f"| {r['n']:,} x {r['d']} | {r['q']} | {r['setup']} | {r['median_ms']:.3f} | "
            f"{r['p90_ms']:.3f} | {ratio:.2f} | {r['calls']} |"
        )
    lines.append("")
    lines.append("| N x D | bare actor call (`len`, 1 shard): median ms | p90 ms |")
    lines.append("| --- | ---: | ---: |")
    for f in floors:
        lines.append(f"| {f['n']:,} x {D} | {f['median_ms']:.3f} | {f['p90_ms']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
