#!/usr/bin/env python3
"""HNSW comparison: topk-hnsw against hnswlib and faiss IndexHNSWFlat.

Runs every library on identical files (corpus.npy, queries.npy,
gt_top100.ivecs), with the same M and ef_construction, and writes one CSV,
an environment record and a recall/QPS plot per data set.

  build time  : one thread (topk-hnsw's deterministic sequential build), and
                all threads of the machine.
  search      : one thread, the whole query set per pass, fastest of
                `--repeats` passes; recall@k against the ground-truth file.

Started by `cargo xtask hnsw-bench`, which builds the sweep binary and passes
its path; it can also be run by hand with the anchor venv's python.
"""

import argparse
import csv
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

EFS = [10, 20, 40, 80, 160, 320]
COLUMNS = ["library", "dataset", "n", "d", "metric", "m", "ef_construction",
           "build_threads", "build_s", "ef", "k", "recall", "qps"]


def read_ivecs(path):
    """Ground truth ids; every row carries its own dimension header."""
    raw = np.fromfile(path, dtype=np.int32)
    if raw.size == 0:
        raise ValueError(f"{path}: empty")
    dim = int(raw[0])
    if dim <= 0 or raw.size % (dim + 1) != 0:
        raise ValueError(f"{path}: size {raw.size} is not rows of 1 + {dim} int32")
    rows = raw.reshape(-1, dim + 1)
    if not np.all(rows[:, 0] == dim):
        bad = int(np.argmax(rows[:, 0] != dim))
        raise ValueError(f"{path}: row {bad} declares dimension {rows[bad, 0]}, row 0 declares {dim}")
    return rows[:, 1:]


def recall_at_k(ids, gt, k):
    hits = 0
    for got, truth in zip(ids, gt):
        hits += len(set(int(i) for i in got[:k]) & set(int(t) for t in truth[:k]))
    return hits / (len(gt) * k)


def load(ds_dir):
    corpus = np.ascontiguousarray(np.load(ds_dir / "corpus.npy"), dtype=np.float32)
    queries = np.ascontiguousarray(np.load(ds_dir / "queries.npy"), dtype=np.float32)
    gt = read_ivecs(ds_dir / "gt_top100.ivecs")
    return corpus, queries, gt


def best_of(repeats, fn):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run_hnswlib(name, corpus, queries, gt, metric, a, threads, sweep):
    import hnswlib
    space = {"dot": "ip", "l2": "l2", "cosine": "cosine"}[metric]
    n, d = corpus.shape
    index = hnswlib.Index(space=space, dim=d)
    index.init_index(max_elements=n, M=a.m, ef_construction=a.ef_construction, random_seed=a.seed)
    t0 = time.perf_counter()
    index.add_items(corpus, np.arange(n), num_threads=threads)
    build_s = time.perf_counter() - t0
    base = dict(library="hnswlib", dataset=name, n=n, d=d, metric=metric, m=a.m,
                ef_construction=a.ef_construction, build_threads=threads, build_s=build_s, k=a.k)
    if not sweep:
        return [dict(base, ef=0, recall="", qps="")]
    rows = []
    for ef in EFS:
        index.set_ef(ef)
        secs, (labels, _) = best_of(a.repeats, lambda: index.knn_query(queries, k=a.k, num_threads=1))
        rows.append(dict(base, ef=ef, recall=recall_at_k(labels, gt, a.k), qps=len(queries) / secs))
    return rows


def run_faiss(name, corpus, queries, gt, metric, a, threads, sweep):
    import faiss
    n, d = corpus.shape
    if metric == "cosine":
        return []
    fm = faiss.METRIC_INNER_PRODUCT if metric == "dot" else faiss.METRIC_L2
    faiss.omp_set_num_threads(threads)
    index = faiss.IndexHNSWFlat(d, a.m, fm)
    index.hnsw.efConstruction = a.ef_construction
    t0 = time.perf_counter()
    index.add(corpus)
    build_s = time.perf_counter() - t0
    base = dict(library="faiss", dataset=name, n=n, d=d, metric=metric, m=a.m,
                ef_construction=a.ef_construction, build_threads=threads, build_s=build_s, k=a.k)
    if not sweep:
        return [dict(base, ef=0, recall="", qps="")]
    faiss.omp_set_num_threads(1)
    rows = []
    for ef in EFS:
        index.hnsw.efSearch = ef
        secs, (_, labels) = best_of(a.repeats, lambda: index.search(queries, a.k))
        rows.append(dict(base, ef=ef, recall=recall_at_k(labels, gt, a.k), qps=len(queries) / secs))
    return rows


def run_ours(name, ds_dir, metric, a, threads, sweep):
    cmd = [a.sweep_bin, "sweep", "--dir", str(ds_dir), "--dataset", name, "--metric", metric,
           "--m", str(a.m), "--ef-construction", str(a.ef_construction), "--k", str(a.k),
           "--build-threads", str(threads), "--repeats", str(a.repeats), "--seed", str(a.seed),
           "--ef", ",".join(map(str, EFS))]
    if not sweep:
        cmd.append("--build-only")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        if line.startswith("HNSW_SWEEP_JSON "):
            r = json.loads(line[len("HNSW_SWEEP_JSON "):])
            rows.append({c: ("" if r.get(c) is None else r.get(c)) for c in COLUMNS})
    return rows


def plot(rows, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot written", file=sys.stderr)
        return
    for ds in sorted({r["dataset"] for r in rows}):
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        for lib in ["topk-hnsw", "hnswlib", "faiss"]:
            pts = [r for r in rows if r["dataset"] == ds and r["library"] == lib
                   and r["build_threads"] == 1 and r["ef"] != 0]
            if pts:
                pts.sort(key=lambda r: r["ef"])
                ax.plot([r["recall"] for r in pts], [r["qps"] for r in pts], marker="o", label=lib)
        ax.set_yscale("log")
        ax.set_xlabel("recall@10")
        ax.set_ylabel("queries per second (1 thread)")
        ax.set_title(f"{ds}: M=16, ef_construction=100, ef 10..320")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / f"recall-qps-{ds}.png", dpi=120)
        plt.close(fig)


def fmt_load(v):
    return " ".join(f"{x:.2f}" for x in v) if v else "unknown"


def summarize(rows, env, out_dir):
    """summary.md: build times, the recall/QPS table, and the two goals."""
    def num(v):
        return None if v in ("", None) else float(v)
    lines = ["# HNSW on the CPU: topk-hnsw, hnswlib, faiss IndexHNSWFlat", "",
             f"Measured on {env['cpu']} ({env['cores']} cores), {env['date_utc']}, commit "
             f"`{env['commit'][:12]}`; load average {fmt_load(env['load_average_at_start'])} at the start, "
             f"{fmt_load(env.get('load_average_at_end'))} at the end (a shared machine: other work ran at the same time). "
             f"M = {env['params']['m']}, ef_construction = {env['params']['ef_construction']}, "
             f"k = {env['params']['k']}; QPS on one thread, best of {env['params']['repeats']} passes "
             "over the query set; recall@10 against the ground-truth file of each set.", ""]
    libs = ["topk-hnsw", "hnswlib", "faiss"]
    for ds in sorted({r["dataset"] for r in rows}):
        sel = [r for r in rows if r["dataset"] == ds]
        lines += [f"## {ds}", "", "| build threads | " + " | ".join(libs) + " |",
                  "| --- |" + " --- |" * len(libs)]
        for t in sorted({int(r["build_threads"]) for r in sel}):
            cells = []
            for lib in libs:
                b = [num(r["build_s"]) for r in sel if r["library"] == lib and int(r["build_threads"]) == t]
                cells.append(f"{b[0]:.1f} s" if b else "–")
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
        lines += ["", "| ef | " + " | ".join(f"{l} recall / QPS" for l in libs) + " |",
                  "| --- |" + " --- |" * len(libs)]
        for ef in EFS:
            cells = []
            for lib in libs:
                p = [r for r in sel if r["library"] == lib and int(r["ef"]) == ef]
                cells.append(f"{num(p[0]['recall']):.4f} / {num(p[0]['qps']):,.0f}" if p else "–")
            lines.append(f"| {ef} | " + " | ".join(cells) + " |")
        best = {}
        for lib in libs:
            pts = [num(r["qps"]) for r in sel if r["library"] == lib and int(r["ef"]) > 0
                   and num(r["recall"]) is not None and num(r["recall"]) >= 0.95]
            best[lib] = max(pts) if pts else None
        build1 = {lib: next((num(r["build_s"]) for r in sel if r["library"] == lib
                             and int(r["build_threads"]) == 1), None) for lib in libs}
        lines.append("")
        if best["topk-hnsw"] and best["hnswlib"]:
            lines.append(f"- Best one-thread QPS at recall@10 ≥ 0.95: topk-hnsw {best['topk-hnsw']:,.0f}, "
                         f"hnswlib {best['hnswlib']:,.0f} (ratio {best['topk-hnsw'] / best['hnswlib']:.2f}; goal ≥ 1)"
                         + (f", faiss {best['faiss']:,.0f}" if best.get("faiss") else "") + ".")
        if build1["topk-hnsw"] and build1["hnswlib"]:
            lines.append(f"- One-thread build: topk-hnsw {build1['topk-hnsw']:.1f} s, hnswlib "
                         f"{build1['hnswlib']:.1f} s (ratio {build1['topk-hnsw'] / build1['hnswlib']:.2f}; goal ≤ 1.5).")
        lines.append("")
    (out_dir / "summary.md").write_text("\n".join(lines))


def environment(a):
    def version(mod):
        try:
            return __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - record why, never fail the run
            return f"unavailable: {e}"
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu, "cores": os.cpu_count(), "machine": platform.machine(),
        "python": platform.python_version(), "numpy": np.__version__,
        "hnswlib": version("hnswlib"), "faiss": version("faiss"),
        "commit": commit, "load_average_at_start": os.getloadavg(),
        "params": {"m": a.m, "ef_construction": a.ef_construction, "k": a.k,
                   "efs": EFS, "repeats": a.repeats, "seed": a.seed},
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep-bin", help="path of the hnsw_sweep example binary")
    p.add_argument("--out", type=Path,
                   help="results directory (default bench/results/hnsw-cpu-<UTC date>)")
    p.add_argument("--minilm", type=Path, help="minilm-docs-20k directory")
    p.add_argument("--gauss", type=Path,
                   help="Gaussian-cluster set directory (generated there when missing)")
    p.add_argument("--gauss-n", type=int, default=100_000)
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--ef-construction", type=int, default=100)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=100)
    p.add_argument("--libraries", default="topk-hnsw,hnswlib,faiss")
    p.add_argument("--summarize", type=Path, metavar="DIR",
                   help="only rewrite DIR/summary.md and the plots from DIR/results.csv")
    a = p.parse_args()
    if a.summarize:
        with open(a.summarize / "results.csv") as f:
            rows = [dict(r, build_threads=int(r["build_threads"]), ef=int(r["ef"]),
                         recall=float(r["recall"]) if r["recall"] else "",
                         qps=float(r["qps"]) if r["qps"] else "")
                    for r in csv.DictReader(f)]
        env = json.loads((a.summarize / "environment.json").read_text())
        plot(rows, a.summarize)
        summarize(rows, env, a.summarize)
        return
    if not a.sweep_bin or not a.gauss:
        p.error("--sweep-bin and --gauss are required (unless --summarize)")
    if a.out is None:
        a.out = Path("bench/results") / f"hnsw-cpu-{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}"
    a.out.mkdir(parents=True, exist_ok=True)
    libs = a.libraries.split(",")

    if not (a.gauss / "gt_top100.ivecs").exists():
        subprocess.run([a.sweep_bin, "gen", "--n", str(a.gauss_n), "--d", "128", "--metric", "l2",
                        "--out-dir", str(a.gauss)], check=True)
    datasets = []
    if a.minilm and (a.minilm / "corpus.npy").exists():
        datasets.append(("minilm-docs-20k", a.minilm, "dot"))
    else:
        print(f"skipping minilm-docs-20k: {a.minilm} not present", file=sys.stderr)
    datasets.append((f"gauss-{a.gauss_n // 1000}k-d128", a.gauss, "l2"))

    env = environment(a)
    rows = []
    threads_all = os.cpu_count() or 1
    for name, ds_dir, metric in datasets:
        corpus, queries, gt = load(ds_dir)
        for threads, sweep in [(1, True), (threads_all, False)] if threads_all > 1 else [(1, True)]:
            for lib in libs:
                print(f"{name}: {lib}, build threads {threads}", file=sys.stderr, flush=True)
                if lib == "topk-hnsw":
                    new = run_ours(name, ds_dir, metric, a, threads, sweep)
                elif lib == "hnswlib":
                    new = run_hnswlib(name, corpus, queries, gt, metric, a, threads, sweep)
                elif lib == "faiss":
                    new = run_faiss(name, corpus, queries, gt, metric, a, threads, sweep)
                else:
                    raise SystemExit(f"unknown library {lib}")
                for r in new:
                    print(json.dumps(r), flush=True)
                rows.extend(new)

    with open(a.out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    env["load_average_at_end"] = os.getloadavg()
    (a.out / "environment.json").write_text(json.dumps(env, indent=1) + "\n")
    plot(rows, a.out)
    summarize(rows, env, a.out)
    print(f"wrote {a.out}/results.csv", file=sys.stderr)


if __name__ == "__main__":
    main()
