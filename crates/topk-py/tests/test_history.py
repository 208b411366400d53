"""Histories of add / upsert / remove / save / open, driven by hypothesis:
a search afterwards returns the same bytes as an index built from scratch
on the final (id, vector) pairs (docs/CONTRACTS.md §10), on both exact
backends, with and without filters."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import topk
from conftest import same_bytes

D = 3
# Small integers make equal scores (ties) common.
values = st.integers(-3, 3).map(float)
vector = st.lists(values, min_size=D, max_size=D)
ident = st.integers(0, 40)

add = st.tuples(st.just("add"), st.lists(st.tuples(ident, vector), max_size=6))
upsert = st.tuples(st.just("upsert"), st.lists(st.tuples(ident, vector), max_size=6))
remove = st.tuples(st.just("remove"), st.lists(st.integers(-2, 45), max_size=8))
reopen = st.tuples(st.just("reopen"), st.sampled_from(["cpu", "oracle"]))
history = st.lists(st.one_of(add, upsert, remove, reopen), max_size=25)


def apply(idx: topk.Index, model: dict[int, list[float]], op, folder: Path) -> topk.Index:
    kind, arg = op
    if kind in ("add", "upsert"):
        # One id once per call (a repeat is an error, tested elsewhere).
        pairs = dict(arg)
        ids = np.array(list(pairs), dtype=np.int64)
        rows = np.array(list(pairs.values()), dtype=np.float32).reshape(-1, D)
        if kind == "add":
            fresh = {i: v for i, v in pairs.items() if i not in model}
            ids = np.array(list(fresh), dtype=np.int64)
            rows = np.array(list(fresh.values()), dtype=np.float32).reshape(-1, D)
            idx.add(rows, ids=ids)
            model.update(fresh)
        else:
            idx.upsert(rows, ids)
            model.update(pairs)
    elif kind == "remove":
        present = {i for i in arg if i in model}
        assert idx.remove(np.array(arg, dtype=np.int64)) == len(present)
        for i in present:
            del model[i]
    else:
        path = folder / "h.topkidx"
        idx.save(path)
        idx = topk.Index.open(path, backend=arg)
    return idx


@settings(max_examples=150, deadline=None)
@given(
    metric=st.sampled_from(["cosine", "dot", "l2"]),
    ops=history,
    queries=st.lists(vector, min_size=1, max_size=3),
    allowed=st.lists(ident, max_size=10),
    k=st.integers(1, 12),
)
def test_history_equals_rebuild(metric, ops, queries, allowed, k) -> None:
    idx = topk.Index(D, metric=metric, backend="cpu")
    model: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for op in ops:
            idx = apply(idx, model, op, Path(folder))
    assert len(idx) == len(model)
    np.testing.assert_array_equal(idx.ids(), sorted(model))
    q = np.array(queries, dtype=np.float32)
    allowed_ids = np.array(allowed, dtype=np.int64)
    for backend in ["cpu", "oracle"]:
        fresh = topk.Index(D, metric=metric, backend=backend)
        if model:
            fresh.add(np.array(list(model.values()), np.float32), ids=list(model))
        same_bytes(idx.search(q, k), fresh.search(q, k))
        same_bytes(idx.search(q, k, filter=allowed_ids), fresh.search(q, k, filter=allowed_ids))
        per = [allowed_ids[i:] for i in range(len(q))]
        same_bytes(idx.search(q, k, filter=per), fresh.search(q, k, filter=per))
