"""Half-width storage through the Python API (docs/CONTRACTS.md §14): an
index of float16 or bfloat16 rows answers exactly like a float32 index of
the rounded rows, rounded here by numpy, independently of the Rust side."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import topk
from conftest import same_bytes


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest, ties to even), as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def stored(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    return round_bf16(x)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    d=st.integers(1, 40),
    k=st.integers(1, 320),
    metric=st.sampled_from(["dot", "cosine", "l2"]),
    dtype=st.sampled_from(["float16", "bfloat16"]),
    ties=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_half_width_index_equals_float32_over_rounded_rows(
    n: int, d: int, k: int, metric: str, dtype: str, ties: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    if ties:
        rows = rng.integers(-3, 4, size=(n, d)).astype(np.float32)
    else:
        rows = rng.standard_normal((n, d), dtype=np.float32) * 10.0
    queries = rng.standard_normal((4, d), dtype=np.float32)
    ids = rng.permutation(10 * n)[:n]
    half = topk.Index(d, metric=metric, dtype=dtype)
    half.add(rows, ids=ids)
    assert half.dtype == dtype and half.nbytes == n * d * 2
    want = topk.Index(d, metric=metric, backend="oracle")
    want.add(stored(rows, dtype), ids=ids)
    same_bytes(half.search(queries, k), want.search(queries, k))
    oracle = topk.Index(d, metric=metric, backend="oracle", dtype=dtype)
    oracle.add(rows, ids=ids)
    same_bytes(oracle.search(queries, k), want.search(queries, k))
    np.testing.assert_array_equal(half.get(int(ids[0])), stored(rows[:1], dtype)[0])


@pytest.mark.parametrize("spelling", ["float16", "f16", "FP16", np.float16, np.dtype("float16")])
def test_dtype_spellings(spelling: object) -> None:
    assert topk.Index(4, dtype=spelling).dtype == "float16"
    assert topk.Index(4).dtype == "float32"
    assert topk.Index(4, dtype="bf16").dtype == "bfloat16"


def test_repr_names_a_half_width_type() -> None:
    assert repr(topk.Index(4, dtype="bf16")) == (
        'topk.Index(dim=4, metric="cosine", backend="cpu", dtype="bfloat16", len=0)'
    )
    assert "dtype" not in repr(topk.Index(4))


def test_an_unknown_dtype_names_it() -> None:
    with pytest.raises(topk.InvalidInputError, match="float64"):
        topk.Index(4, dtype=np.float64)


def test_float16_overflow_names_the_value_and_adds_nothing() -> None:
    idx = topk.Index(3, dtype="float16")
    idx.add(np.ones((2, 3), np.float32))
    bad = np.ones((2, 3), np.float32)
    bad[1, 2] = 1e5
    with pytest.raises(topk.InvalidInputError, match=r"row 1, column 2.*f16"):
        idx.add(bad)
    assert len(idx) == 2
    wide = topk.Index(3, dtype="bfloat16")
    wide.add(bad)
    assert wide.get(1)[2] == round_bf16(np.array([1e5], np.float32))[0]


def test_save_and_open_keep_the_type(tmp_path, rng: np.random.Generator) -> None:
    rows = rng.standard_normal((500, 24), dtype=np.float32)
    q = rng.standard_normal((3, 24), dtype=np.float32)
    sizes = {}
    for dtype in ["float32", "float16", "bfloat16"]:
        idx = topk.Index(24, metric="cosine", dtype=dtype)
        idx.add(rows)
        path = tmp_path / f"{dtype}.topkidx"
        idx.save(path)
        sizes[dtype] = path.stat().st_size
        back = topk.Index.open(path)
        assert back.dtype == dtype
        same_bytes(back.search(q, 10), idx.search(q, 10))
    assert sizes["float16"] == sizes["bfloat16"] < 0.6 * sizes["float32"]
