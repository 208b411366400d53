#!/usr/bin/env python3
"""The CPU anchors of `cargo xtask cpu-compare`: numpy and faiss-cpu on the
very files `topk_bench cpu-compare` wrote (pinned versions in
requirements.txt, installed into target/anchor-venv by `cargo xtask anchor-venv`).

- numpy: `corpus @ q`, `argpartition` for the best K, then a sort of those K;
  a batch is `Q @ corpus.T` in chunks of queries (to bound memory), each row
  selected the same way.
- faiss: `IndexFlatIP` with 1 and 2 OpenMP threads (`faiss.omp_set_num_threads`),
  `index.search` of one query, and of the whole batch.

Usage:
    python cpu_anchors.py --only numpy --data DATA_DIR --out RESULTS/anchors/numpy.jsonl
    python cpu_anchors.py --only faiss --data DATA_DIR --out RESULTS/anchors/faiss.jsonl
    python cpu_anchors.py --pick-coretype
numpy should run without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in its
environment (they select a slower kernel); the xtask command does that.

faiss-cpu's wheel bundles an older OpenBLAS whose CPU detection does not
know newer CPUs: on an Intel Xeon with AVX-512 (family 6, model 207) it
picks a generic kernel and runs batches at a quarter of its speed with the
SkylakeX kernel. `--pick-coretype` times a faiss batch under the library's
own choice and under each OPENBLAS_CORETYPE the CPU's flags allow, and
prints the fastest ("auto" for the library's own); the xtask command runs
faiss with it, so faiss is compared at its best.
"""

import argparse
import gc
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchor_common import configs_by_d, emit, load_manifest, record  # noqa: E402

# Queries per matrix product in a numpy batch: bounds the score matrix to
# CHUNK × N floats (256 MB at N = 1M).
CHUNK = 64


def topk_numpy(scores, k):
    """Indices of the k largest scores, best first."""
    if k < scores.shape[0]:
        part = np.argpartition(-scores, k - 1)[:k]
    else:
        part = np.arange(scores.shape[0])
    return part[np.argsort(-scores[part], kind="stable")]


def numpy_single(corpus, q, k):
    return topk_numpy(corpus @ q, k)


def numpy_batch(corpus, qs, k):
    out = []
    for s in range(0, qs.shape[0], CHUNK):
        block = qs[s:s + CHUNK] @ corpus.T
        k_eff = min(k, corpus.shape[0])
        part = np.argpartition(-block, k_eff - 1, axis=1)[:, :k_eff]
        vals = np.take_along_axis(block, part, axis=1)
        order = np.argsort(-vals, axis=1, kind="stable")
        out.append(np.take_along_axis(part, order, axis=1))
    return np.concatenate(out)


def timed(fn, trials, warmup):
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(trials):
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def run_numpy(corpus_full, queries, configs, manifest, out):
    for cfg in configs:
        corpus = corpus_full[: cfg["n"]]
        k, batch = cfg["k"], cfg["batch"]
        pool = queries.shape[0]
        if batch == 1:
            fn = lambda i: numpy_single(corpus, queries[i % pool], k)  # noqa: E731
        else:
            qs = queries[:batch]
            fn = lambda i: numpy_batch(corpus, qs, k)  # noqa: E731
        times = timed(fn, cfg["trials"], cfg["warmup"])
        emit(out, record(cfg, manifest, "numpy", "cpu", times, numpy=np.__version__))


def run_faiss(corpus_full, queries, configs, manifest, out):
    import faiss

    by_n = {}
    for cfg in configs:
        by_n.setdefault(cfg["n"], []).append(cfg)
    for n, group in sorted(by_n.items()):
        index = faiss.IndexFlatIP(corpus_full.shape[1])
        index.add(np.ascontiguousarray(corpus_full[:n]))
        pool = queries.shape[0]
        for threads in (1, 2):
            faiss.omp_set_num_threads(threads)
            for cfg in group:
                k, batch = cfg["k"], cfg["batch"]
                if batch == 1:
                    rows = [np.ascontiguousarray(queries[i:i + 1]) for i in range(pool)]
                    fn = lambda i: index.search(rows[i % pool], k)  # noqa: E731
                else:
                    qs = np.ascontiguousarray(queries[:batch])
                    fn = lambda i: index.search(qs, k)  # noqa: E731
                times = timed(fn, cfg["trials"], cfg["warmup"])
                emit(out, record(cfg, manifest, f"faiss-{threads}t", "cpu", times,
                                 faiss=faiss.__version__, threads=threads,
                                 openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", "auto")))
        del index
        gc.collect()


def cpu_flags():
    """The CPU's feature flags, from /proc/cpuinfo (empty where unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def coretype_candidates(flags):
    """OPENBLAS_CORETYPE values this CPU can run, "auto" (unset) first."""
    out = ["auto"]
    if {"avx2", "fma"} <= flags:
        out.append("Haswell")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        out.append("SkylakeX")
    return out


def faiss_probe():
    """Seconds of the best of 3 faiss batches (512 queries over 20,000 random
    rows of 384 values, K = 10, one thread): matrix products, as in the
    campaign's batches."""
    import faiss

    rng = np.random.default_rng(7)
    rows = rng.standard_normal((20_000, 384), dtype=np.float32)
    qs = rng.standard_normal((512, 384), dtype=np.float32)
    faiss.omp_set_num_threads(1)
    index = faiss.IndexFlatIP(384)
    index.add(rows)
    return min(timed(lambda _i: index.search(qs, 10), trials=3, warmup=1)) / 1e3


def pick_coretype():
    """The fastest OPENBLAS_CORETYPE for faiss here, each timed in a fresh
    process (OpenBLAS reads it once, at load)."""
    times = {}
    for ct in coretype_candidates(cpu_flags()):
        env = dict(os.environ)
        env.pop("OPENBLAS_CORETYPE", None)
        if ct != "auto":
            env["OPENBLAS_CORETYPE"] = ct
        res = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--faiss-probe"],
            env=env, capture_output=True, text=True, check=False,
        )
        try:
            times[ct] = float(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            print(f"coretype {ct}: probe failed: {res.stderr.strip()[-300:]}", file=sys.stderr)
    if not times:
        return "auto", times
    return min(times, key=times.get), times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["numpy", "faiss"])
    ap.add_argument("--data", help="data folder written by topk_bench cpu-compare")
    ap.add_argument("--out", help="JSON-lines file to write")
    ap.add_argument("--pick-coretype", action="store_true",
                    help="print the fastest OPENBLAS_CORETYPE for faiss here (auto: unset)")
    ap.add_argument("--faiss-probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.faiss_probe:
        print(faiss_probe())
        return
    if args.pick_coretype:
        best, times = pick_coretype()
        for ct, t in times.items():
            print(f"coretype {ct}: {t * 1e3:.1f} ms", file=sys.stderr)
        print(best)
        return
    if not (args.only and args.data and args.out):
        ap.error("--only, --data and --out are required (or --pick-coretype)")

    manifest = load_manifest(args.data)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as out:
        for d, configs in configs_by_d(manifest).items():
            # One in-memory copy of the largest corpus per D; smaller N are views of it.
            corpus = np.load(os.path.join(args.data, manifest["corpus"][d]))
            queries = np.load(os.path.join(args.data, manifest["queries"][d]))
            if args.only == "numpy":
                run_numpy(corpus, queries, configs, manifest, out)
            else:
                run_faiss(corpus, queries, configs, manifest, out)
            del corpus, queries
            gc.collect()


if __name__ == "__main__":
    main()
