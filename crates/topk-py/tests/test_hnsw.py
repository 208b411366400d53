"""The graph backend through the Python API: its options, its files, and
exact answers where its beam covers the whole graph."""

from __future__ import annotations

import numpy as np
import pytest

import topk
from conftest import same_bytes

pytestmark = pytest.mark.skipif(
    topk.backends().get("hnsw") is not True,
    reason=f"hnsw backend: {topk.backends().get('hnsw', 'not in this build')}",
)


def test_a_beam_wider_than_the_graph_is_exact(tmp_path) -> None:
    rows = np.random.default_rng(7).standard_normal((40, 8), dtype=np.float32)
    graph = topk.Index(8, backend="hnsw", m=8, ef_construction=64, ef=64, seed=3)
    exact = topk.Index(8, backend="cpu")
    graph.add(rows)
    exact.add(rows)
    assert graph.backend == "hnsw"
    same_bytes(graph.search(rows[:5], 10), exact.search(rows[:5], 10))
    path = tmp_path / "g.topkidx"
    graph.save(path)
    back = topk.Index.open(path)
    assert back.backend == "hnsw"
    same_bytes(back.search(rows[:5], 10), exact.search(rows[:5], 10))
    assert topk.Index.open(path, backend="cpu").backend == "cpu"


def test_bad_graph_parameters_are_input_errors() -> None:
    with pytest.raises(topk.InvalidInputError, match="invalid HNSW parameter m = 0"):
        idx = topk.Index(8, backend="hnsw", m=0)
        idx.add(np.ones((2, 8), np.float32))
