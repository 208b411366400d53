"""The anchors of the CPU lifecycle benchmark (`cargo xtask lifecycle-bench`).

Subcommands:

- `gen`: writes the shared data set (.npy) that topk's `lifecycle_bench`
  example and the anchors both read: corpus rows, random external ids,
  queries, one allow-list of ids per selectivity, and fresh rows for adds.
- `serve`: faiss-cpu `IndexIDMap2(IndexFlatIP)` (exact) and hnswlib (graph)
  answering the same JSON commands as `lifecycle_bench serve`, one per line
  on stdin, one JSON reply per line on stdout, so that the driver can run
  the two engines interleaved (A, B, A, B) in one invocation.
- `check`: compares topk's exact ids with faiss's, case by case.
- `report`: table.md and the plots (PNG + SVG) of a results folder.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

# Selectivities of the filters, as the tags the data files and commands use.
SELECTIVITIES = {"100": 1.0, "10": 0.1, "1": 0.01, "0.1": 0.001}
LARGEST_ID = (1 << 63) - 1


def log(msg):
    """Progress on stderr (stdout carries the replies)."""
    print(msg, file=sys.stderr, flush=True)


# ---- gen ---------------------------------------------------------------


def gen(args):
    """Rows on a low-dimensional subspace plus noise, normalised (dot on them
    is cosine), with random ids below 2^63, the way embeddings are."""
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.dir, exist_ok=True)
    basis = rng.standard_normal((args.latent, args.d)).astype(np.float32)

    def rows(n):
        out = np.empty((n, args.d), dtype=np.float32)
        for s in range(0, n, 50_000):
            e = min(n, s + 50_000)
            z = rng.standard_normal((e - s, args.latent)).astype(np.float32)
            x = z @ basis + args.noise * rng.standard_normal((e - s, args.d)).astype(
                np.float32
            )
            out[s:e] = x / np.linalg.norm(x, axis=1, keepdims=True)
        return out

    total = args.n + args.extra
    ids = np.unique(rng.integers(0, LARGEST_ID, size=total + 1000, dtype=np.int64))
    rng.shuffle(ids)
    if len(ids) < total:
        raise SystemExit(f"drew only {len(ids)} distinct ids for {total} rows")
    ids = ids[:total].astype(np.uint64)
    np.save(os.path.join(args.dir, "corpus.npy"), rows(args.n))
    np.save(os.path.join(args.dir, "ids.npy"), ids[: args.n])
    np.save(os.path.join(args.dir, "queries.npy"), rows(args.queries))
    np.save(os.path.join(args.dir, "extra.npy"), rows(args.extra))
    np.save(os.path.join(args.dir, "extra_ids.npy"), ids[args.n :])
    for tag, frac in SELECTIVITIES.items():
        count = max(1, round(frac * args.n))
        chosen = rng.choice(args.n, size=count, replace=False)
        np.save(os.path.join(args.dir, f"filter_{tag}.npy"), np.sort(ids[chosen]))
    manifest = {
        "n": args.n,
        "d": args.d,
        "queries": args.queries,
        "extra": args.extra,
        "latent": args.latent,
        "noise": args.noise,
        "seed": args.seed,
        "selectivities": list(SELECTIVITIES),
    }
    with open(os.path.join(args.dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    log(f"data: {args.n} x {args.d} rows, {args.extra} extra, in {args.dir}")


# ---- serve -------------------------------------------------------------


def timed_calls(fn, min_time_s, min_calls=3, max_calls=50):
    """Runs `fn` once to warm up, then until `min_time_s` has passed and at
    least `min_calls` calls were made; returns each call's milliseconds."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_calls and (
        len(times) < min_calls or time.perf_counter() - start < min_time_s
    ):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return times


class Anchors:
    """faiss (exact) and hnswlib (graph) over the shared data set."""

    def __init__(self, data_dir, threads):
        import faiss

        self.faiss = faiss
        self.dir = data_dir
        self.threads = threads
        faiss.omp_set_num_threads(threads)
        load = lambda name: np.load(os.path.join(data_dir, name))
        self.corpus = load("corpus.npy")
        self.ids = load("ids.npy").astype(np.int64)
        self.queries = load("queries.npy")
        self.extra = load("extra.npy")
        self.extra_ids = load("extra_ids.npy").astype(np.int64)
        self.filters = {
            t: load(f"filter_{t}.npy").astype(np.int64) for t in SELECTIVITIES
        }
        self.selectors = {t: faiss.IDSelectorBatch(f) for t, f in self.filters.items()}
        self.allowed_sets = {t: set(f.tolist()) for t, f in self.filters.items()}
        self.flat = None
        self.graph = None
        self.cursor = {"flat": 0, "graph": 0}
        self.queue = {"flat": [], "graph": []}
        self.truth = {}

    def setup_exact(self, _cmd):
        t = time.perf_counter()
        self.flat = self.faiss.IndexIDMap2(self.faiss.IndexFlatIP(self.corpus.shape[1]))
        self.flat.add_with_ids(self.corpus, self.ids)
        return {"build_s": time.perf_counter() - t, "rows": int(self.flat.ntotal)}

    def search_flat(self, queries, k, sel):
        if sel is None:
            return self.flat.search(queries, k)
        params = self.faiss.SearchParameters(sel=self.selectors[sel])
        return self.flat.search(queries, k, params=params)

    def exact(self, cmd):
        k, q, sel = cmd["k"], cmd["q"], cmd["sel"]
        queries = np.ascontiguousarray(self.queries[:q])
        search = lambda: self.search_flat(queries, k, sel)
        times = timed_calls(search, cmd["min_time_s"], min_calls=2)
        reply = {"ms": statistics.median(times), "calls": len(times)}
        if q == 1 and self.threads > 1:
            # One query leaves all but one OpenMP thread idle, and on a loaded
            # machine the idle ones still hold up the region's end: one thread too.
            self.faiss.omp_set_num_threads(1)
            reply["ms_1t"] = statistics.median(
                timed_calls(search, cmd["min_time_s"], min_calls=2)
            )
            self.faiss.omp_set_num_threads(self.threads)
        if cmd.get("save_ids"):
            scores, ids = self.search_flat(queries, k, sel)
            tag = f"k{k}-q{q}-s{sel or 'none'}"
            out = os.path.join(self.dir, "results")
            os.makedirs(out, exist_ok=True)
            np.save(os.path.join(out, f"faiss-{tag}-ids.npy"), ids)
            np.save(os.path.join(out, f"faiss-{tag}-scores.npy"), scores)
        return reply

    def build_graph(self, cmd):
        import hnswlib

        n, d = self.corpus.shape
        self.graph = hnswlib.Index(space="ip", dim=d)
        self.graph.init_index(
            max_elements=n + len(self.extra),
            ef_construction=cmd["ef_construction"],
            M=cmd["m"],
            random_seed=cmd["seed"],
            allow_replace_deleted=True,
        )
        log(f"hnswlib: building {n} rows on {self.threads} threads")
        t = time.perf_counter()
        self.graph.add_items(
            self.corpus, self.ids.astype(np.uint64), num_threads=self.threads
        )
        build_s = time.perf_counter() - t
        self.graph.set_ef(cmd["ef"])
        return {"build_s": build_s, "rows": n, "rows_per_s": n / build_s}

    def exact_truth(self, sel, k):
        key = (sel, k)
        if key not in self.truth:
            self.truth[key] = self.search_flat(self.queries, k, sel)[1]
        return self.truth[key]

    def graph_search(self, cmd):
        k, sel = cmd["k"], cmd["sel"]
        allowed = self.allowed_sets.get(sel)
        filt = None if allowed is None else (lambda label: label in allowed)
        queries = [self.queries[i : i + 1] for i in range(len(self.queries))]
        found = []

        def one_pass():
            found.clear()
            for q in queries:
                labels, _ = self.graph.knn_query(q, k=k, num_threads=1, filter=filt)
                found.append(labels[0])

        passes = timed_calls(one_pass, cmd["min_time_s"], min_calls=2, max_calls=20)
        truth = self.exact_truth(sel, k)
        hits = sum(
            len(set(f.astype(np.int64).tolist()) & set(t.tolist()))
            for f, t in zip(found, truth)
        )
        return {
            "ms_per_query": statistics.median(passes) / len(queries),
            "passes": len(passes),
            "recall": hits / (k * len(queries)),
        }

    def mutate(self, cmd):
        target, kind, batch = cmd["target"], cmd["kind"], cmd["batch"]
        rows, budget = cmd["rows"], cmd["budget_s"]
        done = 0
        start = time.perf_counter()
        while done < rows and time.perf_counter() - start < budget:
            b = min(batch, rows - done)
            if kind == "add":
                c = self.cursor[target]
                if c + b > len(self.extra):
                    raise SystemExit(f"out of extra rows at {c} + {b}")
                x, ids = self.extra[c : c + b], self.extra_ids[c : c + b]
                if target == "flat":
                    self.flat.add_with_ids(x, ids)
                else:
                    self.graph.add_items(
                        x, ids.astype(np.uint64), num_threads=1, replace_deleted=True
                    )
                self.cursor[target] = c + b
                self.queue[target].extend(ids.tolist())
            else:
                q = self.queue[target]
                if not q:
                    break
                ids, self.queue[target] = q[:b], q[b:]
                b = len(ids)
                if target == "flat":
                    self.flat.remove_ids(
                        self.faiss.IDSelectorBatch(np.array(ids, dtype=np.int64))
                    )
                else:
                    for i in ids:
                        self.graph.mark_deleted(i)
            done += b
        s = time.perf_counter() - start
        return {"rows": done, "s": s, "rows_per_s": done / s if s > 0 else None}

    def end_round(self, cmd):
        self.queue[cmd["target"]] = []
        return {"compact_s": None}


def serve(args):
    anchors = Anchors(args.dir, args.threads)
    ops = {
        "setup_exact": anchors.setup_exact,
        "exact": anchors.exact,
        "build_graph": anchors.build_graph,
        "graph": anchors.graph_search,
        "mutate": anchors.mutate,
        "end_round": anchors.end_round,
    }
    print(json.dumps({"ready": True}), flush=True)
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            return
        reply = ops[cmd["op"]](cmd)
        print(json.dumps(reply), flush=True)


# ---- check -------------------------------------------------------------


def check(args):
    """For each exact case saved by both engines: ids of topk's top-K missing
    from faiss's, split into those at a near-tie with the K-th score (faiss
    sums in another order, so its scores differ in the last bits) and the
    others, and the largest score difference on shared ids."""
    res = os.path.join(args.dir, "results")
    with open(os.path.join(args.dir, "manifest.json")) as f:
        d = json.load(f)["d"]
    out = []
    for name in sorted(os.listdir(res)):
        if not (name.startswith("topk-") and name.endswith("-ids.npy")):
            continue
        tag = name[len("topk-") : -len("-ids.npy")]
        other = os.path.join(res, f"faiss-{tag}-ids.npy")
        if not os.path.exists(other):
            continue
        t_ids = np.load(os.path.join(res, name)).astype(np.int64)
        t_sc = np.load(os.path.join(res, f"topk-{tag}-scores.npy"))
        f_ids = np.load(other).astype(np.int64)
        f_sc = np.load(os.path.join(res, f"faiss-{tag}-scores.npy"))
        missing = near_tie = 0
        max_diff = 0.0
        for qi in range(t_ids.shape[0]):
            f_map = {int(i): float(s) for i, s in zip(f_ids[qi], f_sc[qi]) if i >= 0}
            valid = t_sc[qi][t_ids[qi] >= 0]
            kth = float(valid[-1]) if len(valid) else 0.0
            for i, s in zip(t_ids[qi], t_sc[qi]):
                if i < 0:
                    continue
                if int(i) in f_map:
                    max_diff = max(max_diff, abs(f_map[int(i)] - float(s)))
                else:
                    missing += 1
                    if abs(float(s) - kth) <= 1e-5:
                        near_tie += 1
        out.append(
            {
                "d": d,
                "case": tag,
                "queries": int(t_ids.shape[0]),
                "k": int(t_ids.shape[1]),
                "ids_not_in_faiss": missing,
                "of_which_near_tie": near_tie,
                "max_score_diff": max_diff,
            }
        )
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    bad = sum(c["ids_not_in_faiss"] - c["of_which_near_tie"] for c in out)
    log(f"check: {len(out)} cases, {bad} ids differ away from a near-tie")


# ---- report ------------------------------------------------------------


def load_raw(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def spread(values):
    """Median, min and max of the rounds."""
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def fmt(x, unit=""):
    if x is None:
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}{unit}"
    if abs(x) >= 100:
        return f"{x:.0f}{unit}"
    if abs(x) >= 10:
        return f"{x:.1f}{unit}"
    if abs(x) >= 1:
        return f"{x:.2f}{unit}"
    return f"{x:.3f}{unit}"


def cell(s, unit=""):
    if s is None:
        return "–"
    return f"{fmt(s['median'], unit)} ({fmt(s['min'])}–{fmt(s['max'])})"


def group(raw, op, key_fields, value):
    """(key, engine) -> spread of `value` over the rounds of command `op`."""
    out = {}
    for r in raw:
        if r["cmd"]["op"] != op:
            continue
        key = tuple(r["cmd"].get(f) for f in key_fields)
        out.setdefault((key, r["engine"]), []).append(r["reply"].get(value))
    return {k: spread(v) for k, v in out.items()}


def ratio(a, b):
    if a is None or b is None or not b["median"]:
        return None
    return a["median"] / b["median"]


SEL_ORDER = [None, "100", "10", "1", "0.1"]


def sel_name(s):
    return "unfiltered" if s is None else f"{s} %"


def report(args):
    raw = load_raw(args.raw)
    threads = args.threads
    lines = []
    plots = {}
    dims = sorted({r["d"] for r in raw})
    lines.append("## 1. Exact search, filtered and unfiltered (ms per call)\n")
    lines.append(
        "Median over the rounds (min–max of the rounds in brackets); each round's "
        "figure is the median of its calls. topk `Index` (cpu backend) against "
        "faiss `IndexIDMap2(IndexFlatIP)` + `IDSelectorBatch`; ratio < 1: topk faster. "
        "Single queries of faiss are also timed on one OpenMP thread, and the ratio "
        "takes the faster of its two.\n"
    )
    for d in dims:
        rows_d = [r for r in raw if r["d"] == d]
        ex = group(rows_d, "exact", ["k", "q", "sel"], "ms")
        ex1 = group(rows_d, "exact", ["k", "q", "sel"], "ms_1t")
        lines.append(f"\n### D = {d}\n")
        lines.append(
            f"| K | Q | filter | topk ms ({threads} threads) | faiss ms ({threads} threads) "
            "| faiss ms (1 thread) | topk / best faiss |"
        )
        lines.append("| ---: | ---: | --- | ---: | ---: | ---: | ---: |")
        for k in (10, 100):
            for q in (1, 64):
                for sel in SEL_ORDER:
                    key = (k, q, sel)
                    a, b, b1 = (
                        ex.get((key, "topk")),
                        ex.get((key, "faiss")),
                        ex1.get((key, "faiss")),
                    )
                    if a is None and b is None:
                        continue
                    best = (
                        b if b1 is None or (b and b["median"] <= b1["median"]) else b1
                    )
                    rt = ratio(a, best)
                    lines.append(
                        f"| {k} | {q} | {sel_name(sel)} | {cell(a)} | {cell(b)} | {cell(b1)} | "
                        f"{fmt(rt) if rt is not None else '–'} |"
                    )
                    plots.setdefault(("exact", d, k, q), []).append((sel, a, best))
    checks = []
    for path in args.check or []:
        with open(path) as f:
            checks.extend(json.load(f))
    if checks:
        lines.append("\n### Sanity: topk's exact ids against faiss's\n")
        lines.append(
            "faiss sums in another order than topk's canonical score, so its scores "
            "differ in the last bits and near-ties (|score − K-th score| ≤ 1e-5) may "
            "swap at the K-th place.\n"
        )
        lines.append(
            "| D | case | queries × K | topk ids not in faiss's | of which near-ties | max score diff |"
        )
        lines.append("| ---: | --- | ---: | ---: | ---: | ---: |")
        for c in checks:
            lines.append(
                f"| {c['d']} | {c['case']} | {c['queries']} × {c['k']} | {c['ids_not_in_faiss']} | "
                f"{c['of_which_near_tie']} | {c['max_score_diff']:.2e} |"
            )
    graph = [r for r in raw if r["cmd"]["op"] in ("graph", "build_graph")]
    if graph:
        gd = graph[0]["d"]
        gt = group(graph, "graph", ["sel"], "ms_per_query")
        gr = group(graph, "graph", ["sel"], "recall")
        lines.append(
            f"\n## 2. Filtered graph search, D = {gd} (ms per query, one thread, K = 10)\n"
        )
        p = graph[0]["cmd"] if graph[0]["cmd"]["op"] == "build_graph" else {}
        lines.append(
            f"topk-hnsw `search_filtered` against hnswlib `knn_query(filter=...)`, "
            f"M = {p.get('m')}, ef_construction = {p.get('ef_construction')}, ef = {p.get('ef')}; "
            "recall@10 against each side's exact search under the same filter.\n"
        )
        lines.append(
            "| filter | topk-hnsw ms | hnswlib ms | topk / hnswlib | topk-hnsw recall@10 | hnswlib recall@10 |"
        )
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
        for sel in SEL_ORDER:
            a, b = gt.get(((sel,), "topk")), gt.get(((sel,), "hnswlib"))
            if a is None and b is None:
                continue
            ra, rb = gr.get(((sel,), "topk")), gr.get(((sel,), "hnswlib"))
            rt = ratio(a, b)
            lines.append(
                f"| {sel_name(sel)} | {cell(a)} | {cell(b)} | {fmt(rt) if rt else '–'} | "
                f"{ra['median']:.3f} | {rb['median']:.3f} |"
            )
            plots.setdefault(("graph", gd), []).append((sel, a, b))
        builds = {
            r["engine"]: r["reply"] for r in graph if r["cmd"]["op"] == "build_graph"
        }
        lines.append(
            "\n| graph build, all threads | topk-hnsw | hnswlib | topk / hnswlib |"
        )
        lines.append("| --- | ---: | ---: | ---: |")
        a, b = builds.get("topk"), builds.get("hnswlib")
        if a and b:
            lines.append(
                f"| {a['rows']:,} rows: seconds (rows/s) | {a['build_s']:.1f} ({a['rows_per_s']:,.0f}) | "
                f"{b['build_s']:.1f} ({b['rows_per_s']:,.0f}) | {a['build_s'] / b['build_s']:.2f} |"
            )
    muts = [r for r in raw if r["cmd"]["op"] == "mutate"]
    if muts:
        md = muts[0]["d"]
        mt = group(muts, "mutate", ["target", "kind", "batch"], "rows_per_s")
        lines.append(
            f"\n## 3. Add / remove throughput, D = {md} (rows/s, higher is better)\n"
        )
        lines.append(
            "Into the resident index of section 1 (flat) or 2 (graph); each call adds or "
            "removes `batch` rows; a series stops at its row count or its time budget. "
            "topk-hnsw inserts one row at a time (`insert`, one thread), hnswlib "
            "`add_items(num_threads=1, replace_deleted=True)`; removal is `mark_deleted` "
            "per row on both graphs. Ratio > 1: topk faster.\n"
        )
        lines.append(
            "| op | batch | topk Index | faiss IDMap2(Flat) | topk / faiss | topk-hnsw | hnswlib | topk / hnswlib |"
        )
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        keys = sorted(
            {(r["cmd"]["kind"], r["cmd"]["batch"]) for r in muts},
            key=lambda x: (x[0] != "add", x[1]),
        )
        for kind, batch in keys:
            fa, fb = (
                mt.get((("flat", kind, batch), "topk")),
                mt.get((("flat", kind, batch), "faiss")),
            )
            ga, gb = (
                mt.get((("graph", kind, batch), "topk")),
                mt.get((("graph", kind, batch), "hnswlib")),
            )
            r1, r2 = ratio(fa, fb), ratio(ga, gb)
            lines.append(
                f"| {kind} | {batch:,} | {cell(fa)} | {cell(fb)} | {fmt(r1) if r1 else '–'} | "
                f"{cell(ga)} | {cell(gb)} | {fmt(r2) if r2 else '–'} |"
            )
        comp = spread(
            [
                r["reply"].get("compact_s")
                for r in raw
                if r["cmd"]["op"] == "end_round"
                and r["engine"] == "topk"
                and r["cmd"]["target"] == "flat"
            ]
        )
        if comp:
            lines.append(
                f"\ntopk `Index::compact` after each round (untimed above): {cell(comp, ' s')}."
            )
    if args.persist and os.path.exists(args.persist):
        with open(args.persist) as f:
            per = json.load(f)
        lines.append(
            f"\n## 4. Save / open of a {per['n']:,} × {per['d']} cpu Index "
            f"({per['file_bytes'] / 1e9:.2f} GB file), seconds\n"
        )
        lines.append(
            "Raw baselines on the same bytes: a plain write of that many bytes in 1 MiB "
            "chunks + fsync, `cat FILE > /dev/null`, and a plain read loop (1 MiB buffer). "
            "Cold: the file's pages dropped from the page cache first "
            "(`dd iflag=nocache count=0`); warm: read again right after.\n"
        )
        rounds = per["rounds"]
        s = {k: spread([r[k] for r in rounds]) for k in rounds[0]}
        gb = per["file_bytes"] / 1e9
        lines.append("| step | topk | raw | topk / raw | topk GB/s |")
        lines.append("| --- | ---: | ---: | ---: | ---: |")
        for name, ours, base in [
            ("save (write + fsync)", "save_s", "raw_write_s"),
            ("open, cold cache (vs cat)", "open_cold_s", "cat_cold_s"),
            ("open, cold cache (vs read loop)", "open_cold_s", "read_cold_s"),
            ("open, warm cache (vs cat)", "open_warm_s", "cat_warm_s"),
            ("open, warm cache (vs read loop)", "open_warm_s", "read_warm_s"),
        ]:
            rt = ratio(s[ours], s[base])
            lines.append(
                f"| {name} | {cell(s[ours])} | {cell(s[base])} | {fmt(rt)} | {gb / s[ours]['median']:.2f} |"
            )
        lines.append(
            f"\nThe opened index answers a query with the same hits as the saved one: "
            f"{per.get('identical')}. Building it: {per.get('build_s', 0):.1f} s."
        )
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    draw(plots, args.out)
    log(f"table.md and plots in {args.out}")


def draw(plots, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    exact = sorted(k for k in plots if k[0] == "exact")
    graph = [k for k in plots if k[0] == "graph"]
    panels = exact + graph
    if not panels:
        return
    cols = 4
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False
    )
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, key in zip(axes.flat, panels):
        entries = plots[key]
        labels = [sel_name(s) for s, _, _ in entries]
        x = np.arange(len(entries))
        a = [e[1]["median"] if e[1] else np.nan for e in entries]
        b = [e[2]["median"] if e[2] else np.nan for e in entries]
        if key[0] == "exact":
            _, d, k, q = key
            names, title = (
                ("topk Index", "faiss IDMap2(Flat), best"),
                f"exact D={d} K={k} Q={q}",
            )
            unit = "ms per call"
        else:
            names, title = ("topk-hnsw", "hnswlib"), f"graph D={key[1]} K=10, 1 thread"
            unit = "ms per query"
        ax.bar(x - 0.2, a, 0.4, label=names[0], color="#1f77b4")
        ax.bar(x + 0.2, b, 0.4, label=names[1], color="#ff7f0e")
        ax.set_yscale("log")
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit, fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle(
        "Filtered search on a 2-core CPU: topk against faiss-cpu and hnswlib (lower is better)"
    )
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"lifecycle.{ext}"), dpi=110)


# ---- main --------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen", help="write the shared data set")
    g.add_argument("--dir", required=True)
    g.add_argument("--n", type=int, required=True)
    g.add_argument("--d", type=int, required=True)
    g.add_argument("--queries", type=int, default=64)
    g.add_argument("--extra", type=int, required=True)
    g.add_argument("--latent", type=int, default=32)
    g.add_argument("--noise", type=float, default=0.1)
    g.add_argument("--seed", type=int, default=19)
    s = sub.add_parser("serve", help="answer benchmark commands on stdin")
    s.add_argument("--dir", required=True)
    s.add_argument("--threads", type=int, default=os.cpu_count())
    c = sub.add_parser("check", help="compare topk's exact ids with faiss's")
    c.add_argument("--dir", required=True)
    c.add_argument("--out", required=True)
    r = sub.add_parser("report", help="table.md and plots of a results folder")
    r.add_argument("--raw", required=True)
    r.add_argument("--check", nargs="*")
    r.add_argument("--persist")
    r.add_argument("--threads", type=int, default=os.cpu_count())
    r.add_argument("--out", required=True)
    args = ap.parse_args()
    {"gen": gen, "serve": serve, "check": check, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
