"""torch tensors as inputs: CPU tensors everywhere torch is installed, CUDA
tensors where a GPU is (skipped with the reason elsewhere; a failure under
TOPK_REQUIRE_GPU=1)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import topk
from conftest import gpu_or_skip, same_bytes

torch = pytest.importorskip("torch", reason="torch is not installed")


def test_a_cpu_float32_tensor_is_shared_not_copied() -> None:
    idx = topk.Index(8, metric="dot")
    rows = torch.randn(50, 8, generator=torch.Generator().manual_seed(1))
    before = topk.copy_count()
    idx.add(rows)
    got = idx.search(rows[:3], 4)
    assert topk.copy_count() == before
    same_bytes(got, idx.search(rows[:3].numpy(), 4))
    before = topk.copy_count()
    same_bytes(idx.search(rows[:3].double(), 4), got)
    assert topk.copy_count() == before + 1


def test_a_cuda_tensor_on_a_host_index_is_an_error() -> None:
    t = gpu_or_skip()
    idx = topk.Index(4)
    idx.add(np.ones((2, 4), np.float32))
    with pytest.raises(topk.InvalidInputError, match="CUDA tensor"):
        idx.search(t.ones(4, device="cuda"), 1)


def cuda_backend_or_skip() -> object:
    """torch with a device and topk's cuda backend, or a skip with the reason
    (a failure under TOPK_REQUIRE_GPU=1)."""
    t = gpu_or_skip()
    status = topk.backends().get("cuda", "not in this build")
    if status is not True:
        if os.environ.get("TOPK_REQUIRE_GPU") == "1":
            pytest.fail(f"TOPK_REQUIRE_GPU=1 but the cuda backend cannot run: {status}")
        pytest.skip(f"cuda backend: {status}")
    return t


def test_cuda_queries_on_a_cuda_index_match_the_cpu_backend() -> None:
    t = cuda_backend_or_skip()
    rows = np.random.default_rng(3).standard_normal((1000, 64), dtype=np.float32)
    cpu = topk.Index(64, backend="cpu")
    gpu = topk.Index(64, backend="cuda")
    cpu.add(rows)
    gpu.add(rows)
    q = t.from_numpy(rows[:5]).cuda()
    scores, ids = gpu.search(q, 10)
    assert scores.device == q.device and ids.device == q.device
    same_bytes((scores.cpu().numpy(), ids.cpu().numpy()), cpu.search(rows[:5], 10))


def test_device_queries_after_removals_under_filters_match_the_cpu_backend() -> None:
    t = cuda_backend_or_skip()
    rng = np.random.default_rng(4)
    # Rows repeat, so equal scores are common and the id tiebreak decides.
    rows = rng.integers(-2, 3, size=(3000, 32)).astype(np.float32)
    ids = rng.permutation(10_000)[:3000].astype(np.int64)
    for metric in ("dot", "cosine", "l2"):
        cpu = topk.Index(32, metric=metric, backend="cpu")
        gpu = topk.Index(32, metric=metric, backend="cuda", capacity=100)
        for idx in (cpu, gpu):
            idx.add(rows, ids=ids)
            assert idx.remove(ids[::7]) == len(ids[::7])
        q_host = rows[:9] + 0.25
        q = t.from_numpy(q_host).cuda()
        sparse = ids[::40]
        dense = ids[ids % 3 != 0]
        for flt in (None, sparse, dense, [sparse, dense, ids[:5]] * 3):
            got = gpu.search(q, 17, flt)
            assert got[0].device == q.device
            same_bytes((got[0].cpu().numpy(), got[1].cpu().numpy()), cpu.search(q_host, 17, flt))
        # A 1-D query, and a strided one (converted on the device).
        one = gpu.search(q[2], 5)
        same_bytes((one[0].cpu().numpy(), one[1].cpu().numpy()), cpu.search(q_host[2], 5))
        wide = t.from_numpy(np.repeat(q_host, 2, axis=1)).cuda()[:, ::2]
        same_bytes(tuple(x.cpu().numpy() for x in gpu.search(wide, 5)), cpu.search(q_host, 5))


def test_a_non_finite_device_query_is_refused() -> None:
    t = cuda_backend_or_skip()
    gpu = topk.Index(8, backend="cuda")
    gpu.add(np.ones((4, 8), np.float32))
    q = t.ones((3, 8), device="cuda")
    q[1, 3] = float("nan")
    with pytest.raises(topk.InvalidInputError, match="device query 1"):
        gpu.search(q, 2)


def test_cuda_inputs_follow_the_host_rules() -> None:
    """Integer and bool query tensors are a TypeError on the device as on the
    host; CUDA id and filter tensors are read like numpy ones; ids no index
    can hold are ignored by a filter."""
    t = cuda_backend_or_skip()
    rows = np.arange(40, dtype=np.float32).reshape(10, 4)
    cpu = topk.Index(4, metric="dot", backend="cpu")
    gpu = topk.Index(4, metric="dot", backend="cuda")
    for idx in (cpu, gpu):
        idx.add(rows, ids=t.arange(100, 110, device="cuda"))
    np.testing.assert_array_equal(gpu.ids(), cpu.ids())
    for dtype in (t.int64, t.int32, t.bool):
        with pytest.raises(TypeError, match="floating-point"):
            gpu.search(t.ones((2, 4), dtype=dtype, device="cuda"), 3)
    q = t.ones((2, 4), device="cuda")
    allowed = t.tensor([101, 105, 2**63 - 1], device="cuda")
    got = gpu.search(q, 3, filter=allowed)
    want = cpu.search(np.ones((2, 4), np.float32), 3, filter=[101, 105])
    same_bytes((got[0].cpu().numpy(), got[1].cpu().numpy()), want)
    assert gpu.remove(t.tensor([100, 2**62], device="cuda")) == 1
