"""torch CUDA query tensors on a ``cuda`` index against the Rust call and torch.

For each corpus size: one float32 query tensor on the GPU, K = 10. Times
(medians of ``rounds`` calls, wall clock, each call synchronous): the Python
``Index.search`` of the tensor (results come back as tensors on the device),
the Rust ``Index::search_device`` it wraps (timed inside the extension), and
torch's ``torch.topk(corpus @ q, k)``, eager and replayed as a captured CUDA
graph, on the same corpus already on the device. One JSON object per line.

python gpu_queries.py [ROUNDS]
"""

import json
import statistics
import sys
import time

import numpy as np
import torch

import topk

SIZES = [(10_000, 384), (100_000, 1024), (1_000_000, 1024)]
K = 10


def wall(fn, rounds):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def measure(n, d, rounds, dev):
    """One corpus size: the JSON record of its timings."""
    rng = np.random.default_rng(n + d)
    rows = rng.standard_normal((n, d), dtype=np.float32)
    idx = topk.Index(d, metric="dot", backend="cuda", capacity=n)
    idx.add(rows)
    corpus = torch.from_numpy(rows).to(dev)
    q = torch.from_numpy(rng.standard_normal(d, dtype=np.float32)).to(dev)
    _, ids = idx.search(q, K)
    want = torch.topk(corpus @ q, K)
    agree = bool((ids.cpu() == want.indices.cpu()).all())
    t_py = wall(lambda: idx.search(q, K), rounds)
    stream = torch.cuda.current_stream().cuda_stream
    ns = idx._time_rust_search_device(q.data_ptr(), 1, K, stream, rounds)
    t_rust = statistics.median(ns) / 1e9
    t_eager = wall(lambda: torch.topk(corpus @ q, K), rounds)
    static_q = q.clone()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            torch.topk(corpus @ static_q, K)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        torch.topk(corpus @ static_q, K)
    t_graph = wall(g.replay, rounds)
    return {
        "n": n,
        "d": d,
        "k": K,
        "python_search_s": t_py,
        "rust_search_device_s": t_rust,
        "python_minus_rust_us": (t_py - t_rust) * 1e6,
        "torch_eager_s": t_eager,
        "torch_graph_s": t_graph,
        "torch_eager_over_topk": t_eager / t_py,
        "torch_graph_over_topk": t_graph / t_py,
        "ids_agree_with_torch": agree,
    }


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    for n, d in SIZES:
        print(json.dumps(measure(n, d, rounds, dev)), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
