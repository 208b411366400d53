"""torch anchors of the scale-out measurements (topk_bench scale), same shapes.

For each (N, D): a Gaussian corpus generated on the device and L2-normalised
(the shape and distribution of topk_bench's, not its bytes: torch's timings
do not depend on the values), then, with CUDA events:

* single query, K: ``torch.topk(corpus @ q, K)`` in fp32 with TF32 off;
* a batch of Q queries: ``torch.topk(Q @ corpus.T, K, dim=1)`` in fp32 (TF32
  off), with TF32 on, and on a bf16 copy of the corpus;
* the fp32 and TF32 batches again on the host clock with the queries copied
  from pinned host memory and the answers copied back (``*_host_ms``), as a
  caller with host queries sees them;
* the single query and the batch again on f16 (and the single on bf16)
  copies of the corpus and queries: the anchors of half-width storage.

Also torch's host-to-device copy rate of a 4 GiB tensor from pinned and from
pageable memory: the reference for topk's corpus upload.

Usage: python3 scale_anchors.py --ns 1000000,10000000 --ds 768,1024 --out FILE.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def timed(fn, warmup: int, trials: int, host_clock: bool = False) -> list[float]:
    """Milliseconds of ``fn`` per trial after ``warmup`` runs: between CUDA
    events recorded around it, or with ``host_clock`` on the host clock
    through a final synchronisation (copies to and from the host included)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(trials):
        if host_clock:
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out.append((time.perf_counter() - t) * 1e3)
            continue
        a, b = (
            torch.cuda.Event(enable_timing=True),
            torch.cuda.Event(enable_timing=True),
        )
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def upload_rates(gib: int = 4) -> dict:
    n = gib << 28  # float32 values
    host = torch.empty(n, dtype=torch.float32).uniform_()
    dev = torch.empty(n, dtype=torch.float32, device="cuda")
    rates = {}
    for name, src in (("pageable", host), ("pinned", host.pin_memory())):
        dev.copy_(src)
        torch.cuda.synchronize()
        t = time.perf_counter()
        dev.copy_(src)
        torch.cuda.synchronize()
        rates[f"h2d_{name}_gbs"] = n * 4 / (time.perf_counter() - t) / 1e9
    return rates


def measure(n: int, d: int, k: int, batch: int, trials: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(42)
    c = torch.randn(n, d, device="cuda", generator=g)
    c /= c.norm(dim=1, keepdim=True)
    qs = torch.randn(batch, d, device="cuda", generator=g)
    qs /= qs.norm(dim=1, keepdim=True)
    q = qs[0].contiguous()
    torch.backends.cuda.matmul.allow_tf32 = False
    single = timed(lambda: torch.topk(c @ q, k), 5, trials)
    fp32 = timed(lambda: torch.topk(qs @ c.T, k, dim=1), 2, 10)
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32 = timed(lambda: torch.topk(qs @ c.T, k, dim=1), 2, 10)
    # As a caller with host queries and host answers (topk's host batches):
    # the queries from pinned memory, the answers back to the host.
    qs_host = qs.cpu().pin_memory()

    def round_trip():
        v, i = torch.topk(qs_host.to("cuda", non_blocking=True) @ c.T, k, dim=1)
        return v.cpu(), i.cpu()

    tf32_host = timed(round_trip, 2, 10, host_clock=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    fp32_host = timed(round_trip, 2, 10, host_clock=True)
    cb, qb = c.to(torch.bfloat16), qs.to(torch.bfloat16)
    bf16 = timed(lambda: torch.topk(qb @ cb.T, k, dim=1), 2, 10)
    single_bf16 = timed(lambda: torch.topk(cb @ qb[0], k), 5, trials)
    ch, qh = c.to(torch.float16), qs.to(torch.float16)
    single_f16 = timed(lambda: torch.topk(ch @ qh[0], k), 5, trials)
    f16 = timed(lambda: torch.topk(qh @ ch.T, k, dim=1), 2, 10)
    return {
        "what": "torch",
        "n": n,
        "d": d,
        "k": k,
        "batch": batch,
        "single_fp32_ms": statistics.median(single),
        "batch_fp32_ms": statistics.median(fp32),
        "batch_tf32_ms": statistics.median(tf32),
        "batch_fp32_host_ms": statistics.median(fp32_host),
        "batch_tf32_host_ms": statistics.median(tf32_host),
        "batch_bf16_ms": statistics.median(bf16),
        "single_f16_ms": statistics.median(single_f16),
        "single_bf16_ms": statistics.median(single_bf16),
        "batch_f16_ms": statistics.median(f16),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="1000000")
    ap.add_argument("--ds", default="1024")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--batch", default="256", help="batch sizes, comma-separated")
    ap.add_argument(
        "--no-upload", action="store_true", help="skip the host-to-device copy rates"
    )
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.out, "w") as f:
        if not a.no_upload:
            rec = {"what": "torch_upload", **upload_rates()}
            f.write(json.dumps(rec) + "\n")
            print(rec, flush=True)
            torch.cuda.empty_cache()
        for d in [int(x) for x in a.ds.split(",")]:
            for n in [int(x) for x in a.ns.split(",")]:
                for batch in [int(x) for x in a.batch.split(",")]:
                    rec = measure(n, d, a.k, batch, a.trials)
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                    print(rec, flush=True)
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
