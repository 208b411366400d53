"""Torch anchors of the cuda lifecycle benchmark, on the files gpu_lifecycle writes.

Times, with CUDA events (medians): the host-to-device copy of the added rows
(pageable and pinned), and filtered top-K over the same corpus and filters,
two ways: masked scores (score every row, set the excluded to -inf, topk) and
gathered rows (topk over corpus[allowed] @ q, the gather included), single
query and a batch. fp32 with TF32 off, as exact as torch gets. One JSON
object per line on stdout.

python3 lifecycle_anchors.py DIR N D ADD K BATCH REPS
"""

import json
import sys

import numpy as np
import torch


def emit(**kw):
    print(json.dumps(kw), flush=True)


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    out.sort()
    return out[len(out) // 2]


def main():
    d_, n, d, add, k, batch, reps = sys.argv[1:8]
    n, d, add, k, batch, reps = map(int, (n, d, add, k, batch, reps))
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    corpus_h = np.fromfile(f"{d_}/corpus.f32", dtype="<f4").reshape(n, d)
    extra_h = np.fromfile(f"{d_}/extra.f32", dtype="<f4").reshape(add, d)
    queries_h = np.fromfile(f"{d_}/queries.f32", dtype="<f4").reshape(batch, d)
    corpus = torch.from_numpy(corpus_h).to(dev)
    queries = torch.from_numpy(queries_h).to(dev)
    q1 = queries[0]
    extra_t = torch.from_numpy(extra_h)
    pinned = extra_t.pin_memory()
    emit(
        what="h2d pageable (torch .to(cuda))",
        rows=add,
        bytes=add * d * 4,
        s=timed(lambda: extra_t.to(dev), 5),
    )
    emit(
        what="h2d pinned (torch .to(cuda, non_blocking))",
        rows=add,
        bytes=add * d * 4,
        s=timed(lambda: pinned.to(dev, non_blocking=True), 5),
    )
    emit(
        what="torch unfiltered",
        queries=1,
        k=k,
        s=timed(lambda: torch.topk(corpus @ q1, k), reps),
    )
    emit(
        what="torch unfiltered",
        queries=batch,
        k=k,
        s=timed(lambda: torch.topk(queries @ corpus.T, k, dim=1), reps),
    )
    for permille in (1000, 100, 10, 1):
        allowed = np.fromfile(f"{d_}/filter_{permille}.u64", dtype="<u8")
        # Row r of the corpus holds id 2 r.
        rows = torch.from_numpy((allowed // 2).astype(np.int64)).to(dev)
        mask = torch.zeros(n, dtype=torch.bool, device=dev)
        mask[rows] = True
        kk = min(k, rows.numel())
        neg = torch.tensor(float("-inf"), device=dev)

        def masked1():
            s = corpus @ q1
            return torch.topk(torch.where(mask, s, neg), kk)

        def gathered1():
            return torch.topk(corpus[rows] @ q1, kk)

        def maskedb():
            s = queries @ corpus.T
            return torch.topk(torch.where(mask, s, neg), kk, dim=1)

        def gatheredb():
            return torch.topk(queries @ corpus[rows].T, kk, dim=1)

        for name, fn, nq in (
            ("torch masked", masked1, 1),
            ("torch gathered", gathered1, 1),
            ("torch masked", maskedb, batch),
            ("torch gathered", gatheredb, batch),
        ):
            emit(
                what=name,
                queries=nq,
                k=k,
                allowed_permille=permille,
                s=timed(fn, reps if nq == 1 else max(3, reps // 2)),
            )


if __name__ == "__main__":
    main()
