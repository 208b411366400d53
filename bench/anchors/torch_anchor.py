#!/usr/bin/env python3
"""The torch anchor of the GPU campaign: `torch.topk(corpus @ q)` in fp32
with TF32 off, end to end, on the very files `topk_bench campaign` wrote.
Batches are also timed the two inexact ways a user picks for throughput:
with TF32 tensor cores (`torch_tf32`) and over a bf16 copy of the corpus
with the queries cast to bf16 (`torch_bf16`).

Each timed call: the query goes from pinned host memory to the device, the
matrix-vector product (or `Q @ corpus.T` for a batch) and `torch.topk` run,
values and indices come back into pinned host buffers, and the stream is
synchronised. Times are taken with the host clock (the figure compared with
topk's end-to-end times) and with CUDA events (reported beside it).

Usage (inside the GPU bundle, after the campaign):
    python3 torch_anchor.py --data DATA_DIR --out RESULTS/anchors/torch.jsonl
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchor_common import configs_by_d, emit, load_manifest, record, summary  # noqa: E402


def d2d_bandwidth(device, nbytes=1 << 30):
    """Device-to-device copy bandwidth, bytes/s, read + write counted (median of 10)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    times = []
    for _ in range(10):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    del src, dst
    torch.cuda.empty_cache()
    return 2.0 * nbytes / times[len(times) // 2]


def time_config(corpus, q_pinned, cfg, device, stream):
    """Host-clock and CUDA-event times (ms) of one configuration: the
    corpus's dtype is the products' (a bf16 corpus gets bf16 queries)."""
    k, batch = cfg["k"], cfg["batch"]
    pool = q_pinned.shape[0]
    vals_h = torch.empty((batch, k), dtype=torch.float32).pin_memory()
    idx_h = torch.empty((batch, k), dtype=torch.int64).pin_memory()
    host, event = [], []

    def call(i):
        start = (i % pool) if batch == 1 else 0
        q = q_pinned[start:start + batch]
        with torch.cuda.stream(stream):
            qd = q.to(device, non_blocking=True).to(corpus.dtype)
            if batch == 1:
                scores = torch.mv(corpus, qd[0]).unsqueeze(0)
            else:
                scores = qd @ corpus.T
            vals, idx = torch.topk(scores, k, dim=1)
            vals_h.copy_(vals.float(), non_blocking=True)
            idx_h.copy_(idx, non_blocking=True)
        stream.synchronize()

    for i in range(cfg["warmup"]):
        call(i)
    for i in range(cfg["trials"]):
        ev0 = torch.cuda.Event(enable_timing=True)
        ev1 = torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        ev0.record(stream)
        call(i)
        ev1.record(stream)
        t1 = time.perf_counter()
        ev1.synchronize()
        host.append((t1 - t0) * 1e3)
        event.append(ev0.elapsed_time(ev1))
    return host, event


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="data folder written by topk_bench campaign")
    ap.add_argument("--out", required=True, help="JSON-lines file to write")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--min-trials", type=int, default=20, help="at least this many timed trials")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        sys.exit("torch_anchor: no CUDA device visible to torch")
    # fp32 as written: no TF32 tensor-core shortcut in the matrix products
    # (the torch_tf32 rows turn it on for their own calls only).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    manifest = load_manifest(args.data)
    device = torch.device(args.device)
    stream = torch.cuda.Stream(device)
    bw = d2d_bandwidth(device)
    env = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(device),
        "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "d2d_bytes_per_s": bw,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(os.path.splitext(args.out)[0] + "_env.json", "w") as f:
        json.dump(env, f, indent=2)
    print(f"torch {env['torch']} on {env['device']}, D2D {bw / 1e9:.0f} GB/s", file=sys.stderr)

    with open(args.out, "w") as out:
        for d, configs in configs_by_d(manifest).items():
            corpus_np = np.load(os.path.join(args.data, manifest["corpus"][d]), mmap_mode="r")
            queries_np = np.load(os.path.join(args.data, manifest["queries"][d]), mmap_mode="r")
            full = torch.from_numpy(np.ascontiguousarray(corpus_np)).to(device)
            q_pinned = torch.from_numpy(np.ascontiguousarray(queries_np)).pin_memory()
            half = None
            for cfg in configs:
                cfg = dict(cfg, trials=max(cfg["trials"], args.min_trials))
                variants = [("torch", full, False)]
                if cfg["batch"] > 1:
                    if half is None:
                        half = full.to(torch.bfloat16)
                    variants += [("torch_tf32", full, True), ("torch_bf16", half, False)]
                for backend, corpus, tf32 in variants:
                    torch.backends.cuda.matmul.allow_tf32 = tf32
                    host, event = time_config(corpus[: cfg["n"]], q_pinned, cfg, device, stream)
                    torch.backends.cuda.matmul.allow_tf32 = False
                    ev = summary(event)
                    emit(out, record(cfg, manifest, backend, "resident", host,
                                     event_median_ms=ev["median_ms"], event_min_ms=ev["min_ms"],
                                     timer="host clock; event_* from CUDA events"))
            del full, half, q_pinned
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
