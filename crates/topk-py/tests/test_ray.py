"""Sharded search: ``topk.merge`` and ``topk.shard_of`` (no Ray), then
``topk.ray.ShardedIndex`` on a local Ray instance with three CPU shard
actors, compared bit for bit with one ``topk.Index`` over the same content:
random histories with ties, filters, save / open, bad inputs, and actors
killed mid-run (docs/CONTRACTS.md §12)."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import topk
import topk._ray_shard
import topk.ray
from conftest import same_bytes

D = 3
METRICS = ["cosine", "dot", "l2"]


# -- topk.shard_of and topk.merge (no Ray) ------------------------------------


def test_shard_of_matches_the_pinned_rule() -> None:
    got = topk.shard_of(np.arange(12), 4)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, [3, 2, 2, 0, 1, 1, 2, 1, 2, 2, 0, 1])
    np.testing.assert_array_equal(topk.shard_of([0, topk.MAX_ID], 1), [0, 0])
    assert topk.PLACEMENT == "splitmix64-mulshift"


def test_shard_of_refuses_bad_input() -> None:
    with pytest.raises(topk.InvalidInputError, match="shards must be at least 1, got shards = 0"):
        topk.shard_of([1], 0)
    with pytest.raises(topk.InvalidInputError, match="id -3 at position 1 is negative"):
        topk.shard_of([1, -3], 2)
    with pytest.raises(topk.InvalidInputError, match="above the largest id"):
        topk.shard_of(np.array([2**63], np.uint64), 2)


def split(metric: str, rows: np.ndarray, ids: np.ndarray, shards: int) -> list[topk.Index]:
    """One index per shard of ``shards``, placed by ``shard_of``."""
    owner = topk.shard_of(ids, shards)
    parts = []
    for s in range(shards):
        idx = topk.Index(rows.shape[1], metric=metric)
        sel = owner == s
        idx.add(rows[sel], ids=ids[sel])
        parts.append(idx)
    return parts


@settings(max_examples=60, deadline=None)
@given(
    metric=st.sampled_from(METRICS),
    n=st.integers(0, 40),
    shards=st.integers(1, 5),
    k=st.integers(1, 50),
    single=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_merge_of_shards_is_one_index(metric, n, shards, k, single, seed) -> None:
    rng = np.random.default_rng(seed)
    # Small integer values: many equal scores, so the id tiebreak decides.
    rows = rng.integers(-2, 3, (n, D)).astype(np.float32)
    ids = rng.choice(10_000, n, replace=False).astype(np.int64)
    whole = topk.Index(D, metric=metric)
    whole.add(rows, ids=ids)
    parts = split(metric, rows, ids, shards)
    q = rng.integers(-2, 3, D if single else (4, D)).astype(np.float32)
    merged = topk.merge([p.search(q, k) for p in parts], k, metric)
    same_bytes(merged, whole.search(q, k))
    # Shards searched with a larger k still merge to the best k.
    same_bytes(topk.merge([p.search(q, k + 3) for p in parts], k, metric), whole.search(q, k))


def test_merge_refuses_bad_input() -> None:
    idx = topk.Index(D)
    idx.add(np.eye(D, dtype=np.float32))
    one = idx.search(np.ones(D, np.float32), 2)
    batch = idx.search(np.ones((2, D), np.float32), 2)
    bad = [
        (([], 2, "dot"), "at least one"),
        (([one], 0, "dot"), "k must be at least 1, got k = 0"),
        (([one, batch], 2, "dot"), "every shard must answer the same queries"),
        (([batch, (batch[0][:1], batch[1][:1])], 2, "dot"), "same queries"),
        (([(one[0], one[1][:1])], 2, "dot"), "shape"),
        (([(one[0].astype(np.float64), one[1])], 2, "dot"), "float32"),
        (([(one[0], np.array([-2, 0]))], 2, "dot"), "id -2 is negative"),
        (([(np.array([np.nan, 1], np.float32), one[1])], 2, "dot"), "NaN"),
        (([one, one], 2, "dot"), "shards 0 and 1 for query 0"),
        (([one, one], 1, "dot"), "shards 0 and 1 for query 0"),
        (([(one[0], np.array([3, 3]))], 1, "dot"), "id 3 is twice in shard 0's result"),
        (([one], 2, "hamming"), "hamming"),
    ]
    for args, message in bad:
        with pytest.raises(topk.InvalidInputError, match=message):
            topk.merge(*args)


def test_merge_keeps_the_l2_convention_and_padding() -> None:
    a, b = topk.Index(D, metric="l2"), topk.Index(D, metric="l2")
    a.add(np.zeros((1, D), np.float32), ids=[7])
    q = np.ones(D, np.float32)
    scores, ids = topk.merge([a.search(q, 3), b.search(q, 3)], 3, "l2")
    np.testing.assert_array_equal(ids, [7, -1, -1])
    np.testing.assert_array_equal(scores, [3.0, np.inf, np.inf])


# -- topk.ray ---------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray instance sized for this machine (its shard actors take no CPU)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def sharded(ray_local):
    """One three-shard set per metric, emptied by each test that uses it."""
    sets = {m: topk.ray.ShardedIndex(D, metric=m, shards=3, num_cpus=0) for m in METRICS}
    yield sets
    for s in sets.values():
        s.close()


def emptied(s: topk.ray.ShardedIndex) -> topk.ray.ShardedIndex:
    s.remove(s.ids())
    assert len(s) == 0
    return s


def same_content(s: topk.ray.ShardedIndex, one: topk.Index) -> None:
    assert len(s) == len(one)
    np.testing.assert_array_equal(s.ids(), one.ids())


def same_searches(s, one, queries: np.ndarray, allowed: np.ndarray, k: int) -> None:
    """Every search form returns the bytes of the single index."""
    for q in (queries, queries[0]):
        same_bytes(s.search(q, k), one.search(q, k))
        same_bytes(s.search(q, k, filter=allowed), one.search(q, k, filter=allowed))
    per = [allowed[i:] for i in range(len(queries))]
    same_bytes(s.search(queries, k, filter=per), one.search(queries, k, filter=per))


def outcome(call):
    """The result of ``call()``, or the class of what it raised."""
    try:
        return call()
    except (topk.TopkError, TypeError) as e:
        return type(e)


values = st.integers(-2, 2).map(float)
vector = st.lists(values, min_size=D, max_size=D)
ident = st.integers(0, 30)
pairs = st.lists(st.tuples(ident, vector), max_size=6)
op = st.one_of(
    st.tuples(st.just("add"), pairs),
    st.tuples(st.just("add_auto"), st.lists(vector, max_size=4)),
    # One vector under several ids: exact ties across shards.
    st.tuples(st.just("dup"), st.tuples(vector, st.lists(ident, min_size=2, max_size=5))),
    st.tuples(st.just("upsert"), pairs),
    st.tuples(st.just("remove"), st.lists(st.integers(-2, 35), max_size=8)),
)


def rows_ids(items) -> tuple[np.ndarray, np.ndarray]:
    rows = np.array([v for _, v in items], dtype=np.float32).reshape(-1, D)
    return rows, np.array([i for i, _ in items], dtype=np.int64)


def apply(s, one: topk.Index, kind: str, arg) -> None:
    """Applies one operation to both; they must agree on the result or the error."""
    if kind == "add":
        rows, ids = rows_ids(arg)
        got, want = outcome(lambda: s.add(rows, ids)), outcome(lambda: one.add(rows, ids))
    elif kind == "add_auto":
        rows = np.array(arg, dtype=np.float32).reshape(-1, D)
        got, want = outcome(lambda: s.add(rows)), outcome(lambda: one.add(rows))
    elif kind == "dup":
        vec, ids = arg
        rows = np.array([vec] * len(ids), dtype=np.float32)
        got, want = outcome(lambda: s.add(rows, ids)), outcome(lambda: one.add(rows, ids))
    elif kind == "upsert":
        rows, ids = rows_ids(arg)
        got, want = outcome(lambda: s.upsert(rows, ids)), outcome(lambda: one.upsert(rows, ids))
    else:
        ids = np.array(arg, dtype=np.int64)
        got, want = outcome(lambda: s.remove(ids)), outcome(lambda: one.remove(ids))
    if isinstance(want, type):
        assert got is want, (kind, arg)
    elif want is None:
        assert got is None
    else:
        np.testing.assert_array_equal(got, want)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    metric=st.sampled_from(METRICS),
    ops=st.lists(op, max_size=12),
    queries=st.lists(vector, min_size=2, max_size=3),
    allowed=st.lists(st.integers(-1, 40), max_size=12),
    k=st.integers(1, 12),
)
def test_history_equals_one_index(sharded, metric, ops, queries, allowed, k) -> None:
    s = emptied(sharded[metric])
    one = topk.Index(D, metric=metric)
    for kind, arg in ops:
        apply(s, one, kind, arg)
    same_content(s, one)
    for i in one.ids()[:3]:
        np.testing.assert_array_equal(
            s.get(int(i)).view(np.uint32), one.get(int(i)).view(np.uint32)
        )
        assert int(i) in s
    assert s.get(999) is None and 999 not in s and -1 not in s
    q = np.array(queries, dtype=np.float32)
    same_searches(s, one, q, np.array(allowed, dtype=np.int64), k)
    s.compact()
    same_searches(s, one, q, np.array(allowed, dtype=np.int64), k)


def test_larger_random_corpus_equals_one_index(sharded, rng) -> None:
    s = emptied(sharded["cosine"])
    one = topk.Index(D, metric="cosine")
    rows = rng.standard_normal((3000, D)).astype(np.float32)
    rows[1000:1100] = rows[0]  # a hundred exact ties
    np.testing.assert_array_equal(s.add(rows), one.add(rows))
    gone = rng.choice(3000, 700, replace=False)
    assert s.remove(gone) == one.remove(gone) == 700
    new = rng.standard_normal((300, D)).astype(np.float32)
    s.upsert(new, gone[:300])
    one.upsert(new, gone[:300])
    q = rng.standard_normal((16, D)).astype(np.float32)
    same_searches(s, one, q, rng.choice(3000, 900, replace=False).astype(np.int64), 25)
    same_bytes(s.search(rows[0], 150), one.search(rows[0], 150))


def test_bad_input_raises_what_index_raises_and_changes_nothing(sharded) -> None:
    s = emptied(sharded["dot"])
    one = topk.Index(D, metric="dot")
    rows = np.arange(12 * D, dtype=np.float32).reshape(12, D)
    s.add(rows)
    one.add(rows)
    # New ids on every shard and one present id: the shards that took their
    # part roll it back when the present id is refused.
    clash = [*range(12, 24), 5]
    assert set(topk.shard_of(clash[:-1], 3).tolist()) == {0, 1, 2}
    nan = np.ones((2, D), np.float32)
    nan[1, 2] = np.nan
    cases = [
        ("wrong dim", lambda x: x.add(np.ones((2, D + 1), np.float32))),
        ("id present on one shard", lambda x: x.add(np.ones((13, D), np.float32), ids=clash)),
        ("id twice in the call", lambda x: x.add(np.ones((3, D), np.float32), ids=[20, 21, 20])),
        ("negative id", lambda x: x.add(np.ones((2, D), np.float32), ids=[30, -4])),
        ("count mismatch", lambda x: x.add(np.ones((2, D), np.float32), ids=[30])),
        ("NaN", lambda x: x.add(nan, ids=[40, 41])),
        ("upsert NaN", lambda x: x.upsert(nan, [0, 41])),
        ("upsert twice", lambda x: x.upsert(np.ones((2, D), np.float32), [1, 1])),
        ("upsert wrong dim", lambda x: x.upsert(np.ones((1, 2), np.float32), [1])),
        ("k = 0", lambda x: x.search(np.ones(D, np.float32), 0)),
        ("k a float", lambda x: x.search(np.ones(D, np.float32), 2.0)),
        ("get of a str", lambda x: x.get("7")),
        ("in of a str", lambda x: "7" in x),
        ("query dim", lambda x: x.search(np.ones(D + 2, np.float32), 3)),
        ("query NaN", lambda x: x.search(np.full(D, np.nan, np.float32), 3)),
        (
            "filter count",
            lambda x: x.search(np.ones((2, D), np.float32), 3, filter=[[1], [2], [3]]),
        ),
        ("int rows", lambda x: x.add(np.ones((1, D), np.int64))),
        ("0-d query", lambda x: x.search(np.array(1.0, np.float32), 1)),
        ("3-d queries", lambda x: x.search(np.ones((1, 2, D), np.float32), 1)),
    ]
    for name, call in cases:
        want = outcome(lambda call=call: call(one))
        assert isinstance(want, type), name
        got = outcome(lambda call=call: call(s))
        assert got is want, name
        same_content(s, one)
    q = np.ones((2, D), np.float32)
    same_bytes(s.search(q, 20), one.search(q, 20))
    with pytest.raises(topk.InvalidInputError, match="already in the index"):
        s.add(np.ones((13, D), np.float32), ids=clash)


def test_constructor_checks(ray_local, tmp_path) -> None:
    with pytest.raises(topk.InvalidInputError, match="shards must be"):
        topk.ray.ShardedIndex(D, shards=0)
    with pytest.raises(topk.InvalidInputError, match="dim"):
        topk.ray.ShardedIndex(0, shards=2)
    with pytest.raises(topk.InvalidInputError, match="metric"):
        topk.ray.ShardedIndex(D, metric="hamming", shards=2)
    with pytest.raises(topk.InvalidInputError, match="unknown backend"):
        topk.ray.ShardedIndex(D, backend="gpu9", shards=2)
    with pytest.raises(TypeError, match="unknown option"):
        topk.ray.ShardedIndex(D, shards=2, colour=3)
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(topk.InvalidInputError, match="already holds a saved set"):
        topk.ray.ShardedIndex(D, shards=2, path=tmp_path)


def test_save_open_round_trip(ray_local, tmp_path, rng) -> None:
    folder = tmp_path / "set"
    s = topk.ray.ShardedIndex(D, metric="l2", shards=3, path=folder, num_cpus=0)
    one = topk.Index(D, metric="l2")
    try:
        rows = rng.integers(-3, 4, (400, D)).astype(np.float32)
        s.add(rows)
        one.add(rows)
        s.remove(np.arange(0, 400, 7))
        one.remove(np.arange(0, 400, 7))
        s.save()
        first = topk._topk._read_manifest(folder)
        s.upsert(rows[:5] + 1, [1, 2, 3, 500, 501])
        one.upsert(rows[:5] + 1, [1, 2, 3, 500, 501])
        s.save()
    finally:
        s.close()
    manifest = topk._topk._read_manifest(folder)
    assert manifest["generation"] == first["generation"] + 1 == 2
    assert manifest["placement"] == topk.PLACEMENT and manifest["dim"] == D
    assert manifest["metric"] == "l2" and len(manifest["shards"]) == 3
    on_disk = json.loads((folder / "manifest.json").read_text())
    assert on_disk["format"] == "topk-shards" and on_disk["version"] == 1
    # The plain per-shard view: every file is a topk.Index holding its
    # placement's ids; the older generation's files are gone.
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".topkidx"))
    assert names == sorted(e["file"] for e in manifest["shards"])
    held = []
    for i, entry in enumerate(manifest["shards"]):
        part = topk.Index.open(folder / entry["file"])
        assert len(part) == entry["rows"] and entry["backend"] == "cpu"
        assert np.all(topk.shard_of(part.ids(), 3) == i)
        held.append(part.ids())
    np.testing.assert_array_equal(np.sort(np.concatenate(held)), one.ids())
    again = topk.ray.ShardedIndex.open(folder, backend="oracle", num_cpus=0)
    try:
        assert again.backend == "oracle" and again.shards == 3 and again.metric == "l2"
        same_content(again, one)
        q = rng.integers(-3, 4, (5, D)).astype(np.float32)
        same_searches(again, one, q, np.arange(0, 600, 3), 30)
        # The auto ids continue after the largest of the whole set.
        np.testing.assert_array_equal(again.add(rows[:2]), one.add(rows[:2]))
    finally:
        again.close()


def test_half_width_shards(ray_local, tmp_path, rng) -> None:
    """``dtype="float16"`` shards answer like one float16 index, refuse a
    value float16 cannot hold before any shard changes, and reopen as
    float16."""
    folder = tmp_path / "half"
    s = topk.ray.ShardedIndex(D, metric="dot", shards=3, path=folder, num_cpus=0, dtype="float16")
    one = topk.Index(D, metric="dot", dtype="float16")
    try:
        assert s.dtype == "float16"
        rows = rng.standard_normal((300, D)).astype(np.float32)
        s.add(rows)
        one.add(rows)
        bad = rows[:4].copy()
        bad[3, 1] = 1e5
        with pytest.raises(topk.InvalidInputError, match="f16"):
            s.add(bad, ids=[1000, 1001, 1002, 1003])
        with pytest.raises(topk.InvalidInputError, match="f16"):
            s.upsert(bad, ids=[0, 1, 2, 3])
        same_content(s, one)
        q = rng.standard_normal((4, D)).astype(np.float32)
        same_searches(s, one, q, np.arange(0, 300, 2), 20)
        s.save()
    finally:
        s.close()
    again = topk.ray.ShardedIndex.open(folder, num_cpus=0)
    try:
        assert again.dtype == "float16"
        same_content(again, one)
    finally:
        again.close()


def test_open_refuses_a_bad_set(ray_local, tmp_path) -> None:
    with pytest.raises(topk.IndexFileError):
        topk.ray.ShardedIndex.open(tmp_path)
    # A shard file whose ids the placement puts elsewhere.
    idx = topk.Index(D)
    idx.add(np.ones((4, D), np.float32))
    idx.save(tmp_path / "shard-0000.g1.topkidx")
    idx.save(tmp_path / "shard-0001.g1.topkidx")
    topk._topk._write_manifest(
        tmp_path,
        {
            "dim": D,
            "metric": "cosine",
            "generation": 1,
            "shards": [
                {"file": f"shard-000{i}.g1.topkidx", "rows": 4, "backend": "cpu"} for i in range(2)
            ],
        },
    )
    with pytest.raises(topk.IndexFileError, match="placement rule puts on shard"):
        topk.ray.ShardedIndex.open(tmp_path, num_cpus=0)


def restarted(actor, before: int) -> None:
    """Waits until ``actor`` answers from a new process."""
    assert ray.get(actor.pid.remote()) != before


def test_killed_actors_lose_nothing(ray_local, tmp_path, rng) -> None:
    s = topk.ray.ShardedIndex(D, metric="cosine", shards=3, path=tmp_path / "k", num_cpus=0)
    one = topk.Index(D, metric="cosine")
    try:
        rows = rng.integers(-2, 3, (300, D)).astype(np.float32)
        s.add(rows)
        one.add(rows)
        s.save()
        s.remove(np.arange(0, 300, 5))
        one.remove(np.arange(0, 300, 5))
        q = rng.integers(-2, 3, (6, D)).astype(np.float32)
        allowed = np.arange(0, 400, 2)
        # Between calls: the restarted actor reopens its saved file and
        # replays the removals logged since.
        victim = s.actors[1]
        pid = ray.get(victim.pid.remote())
        ray.kill(victim, no_restart=False)
        same_searches(s, one, q, allowed, 40)
        restarted(victim, pid)
        same_content(s, one)
        # During a stream of mutations: another thread kills a shard while
        # the driver keeps mutating; retried calls apply once.
        go = threading.Event()
        victim = s.actors[2]
        pid = ray.get(victim.pid.remote())

        def kill() -> None:
            go.wait()
            ray.kill(victim, no_restart=False)

        killer = threading.Thread(target=kill)
        killer.start()
        try:
            for step in range(40):
                if step == 5:
                    go.set()
                new = rng.integers(-2, 3, (6, D)).astype(np.float32)
                ids = rng.choice(400, 6, replace=False).astype(np.int64)
                if step % 3 == 0:
                    np.testing.assert_array_equal(s.add(new), one.add(new))
                elif step % 3 == 1:
                    s.upsert(new, ids)
                    one.upsert(new, ids)
                else:
                    assert s.remove(ids) == one.remove(ids)
        finally:
            go.set()
            killer.join()
        restarted(victim, pid)
        same_content(s, one)
        same_searches(s, one, q, allowed, 40)
        # Every shard killed at once, then searched.
        pids = [ray.get(a.pid.remote()) for a in s.actors]
        for a in s.actors:
            ray.kill(a, no_restart=False)
        same_searches(s, one, q, allowed, 40)
        for a, p in zip(s.actors, pids, strict=True):
            restarted(a, p)
    finally:
        s.close()
    assert not (tmp_path / "k" / ".topk-ray-logs").exists()


def test_torn_log_record_is_ignored(tmp_path) -> None:
    log = tmp_path / "x.log"
    records = [("base", {}, 0), ("mut", 1, "remove", np.array([1]))]
    whole = b"".join(topk._ray_shard._encode(r) for r in records)
    log.write_bytes(whole + topk._ray_shard._encode(("mut", 2, "remove", np.array([2])))[:-3])
    got = topk._ray_shard._read_log(log)
    assert [r[:2] for r in got] == [("base", {}), ("mut", 1)]
    assert log.read_bytes() == whole
    bad = bytearray(whole)
    bad[20] ^= 0xFF
    log.write_bytes(bytes(bad) + topk._ray_shard._encode(("mut", 2, "remove", np.array([2]))))
    with pytest.raises(topk.IndexFileError, match="record at byte 0 fails its CRC-32"):
        topk._ray_shard._read_log(log)
    # A crash that left zeros past the last whole record: dropped.
    log.write_bytes(whole + bytes(64))
    assert [r[:2] for r in topk._ray_shard._read_log(log)] == [("base", {}), ("mut", 1)]
    assert log.read_bytes() == whole


def test_corrupt_log_length_is_refused_not_cut(tmp_path) -> None:
    log = tmp_path / "x.log"
    records = [("base", {}, 0), ("mut", 1, "remove", np.array([1])), ("mut", 2, "add", None)]
    whole = b"".join(topk._ray_shard._encode(r) for r in records)
    second = len(topk._ray_shard._encode(records[0]))
    bad = bytearray(whole)
    bad[second : second + 4] = (0xFFFFFFF0).to_bytes(4, "little")
    log.write_bytes(bytes(bad))
    with pytest.raises(topk.IndexFileError, match=f"header at byte {second} fails"):
        topk._ray_shard._read_log(log)
    assert log.read_bytes() == bytes(bad), "a corrupt log must not be cut"


@pytest.mark.parametrize("op", ["add", "upsert", "remove"])
def test_a_log_that_cannot_take_a_mutation_leaves_the_shard_unchanged(
    tmp_path, monkeypatch, op
) -> None:
    init = {"dim": D, "metric": "dot", "backend": "cpu"}
    log = tmp_path / "s.log"
    shard = topk._ray_shard._Shard(0, 1, str(log), init)
    rows = np.arange(4 * D, dtype=np.float32).reshape(4, D)
    shard.mutate(1, "add", (rows, np.arange(4, dtype=np.int64)), False)
    before = (shard.ids().copy(), [shard.get(i).copy() for i in range(4)], log.read_bytes())

    def full(fd: int, data: bytes) -> None:
        os.write(fd, data[:5])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(topk._ray_shard, "_append", full)
    ids = np.array([2, 7], dtype=np.int64)
    args = {
        "add": (np.ones((1, D), np.float32), ids[1:]),
        "upsert": (np.ones((2, D), np.float32), ids),
        "remove": ids,
    }[op]
    with pytest.raises(topk.IndexFileError, match="No space left on device"):
        shard.mutate(2, op, args, False)
    np.testing.assert_array_equal(shard.ids(), before[0])
    for i, v in enumerate(before[1]):
        np.testing.assert_array_equal(shard.get(i).view(np.uint32), v.view(np.uint32))
    assert shard.get(7) is None
    assert log.read_bytes() == before[2], "the torn record must be cut off the log"
    # The shard goes on: the same mutation is taken once the disk has room,
    # and a restart from the log sees it.
    monkeypatch.undo()
    shard.mutate(2, op, args, False)
    after = shard.ids().copy()
    restarted = topk._ray_shard._Shard(0, 1, str(log), init)
    np.testing.assert_array_equal(restarted.ids(), after)


def test_ray_is_imported_only_when_used() -> None:
    import subprocess
    import sys

    code = "import sys, topk.ray; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_closed_set_refuses_calls(ray_local) -> None:
    s = topk.ray.ShardedIndex(D, shards=1, num_cpus=0)
    folder = s.path
    s.add(np.ones((2, D), np.float32))
    s.close()
    s.close()
    assert not Path(folder).exists()
    with pytest.raises(topk.InvalidInputError, match="closed"):
        s.search(np.ones(D, np.float32), 1)


def test_a_save_into_the_sets_own_temporary_folder_outlives_close(ray_local, rng) -> None:
    s = topk.ray.ShardedIndex(D, shards=2, num_cpus=0)
    rows = rng.standard_normal((20, D)).astype(np.float32)
    s.add(rows)
    s.save()
    folder = s.path
    s.close()
    back = topk.ray.ShardedIndex.open(folder, num_cpus=0)
    try:
        assert len(back) == 20
    finally:
        back.close()
    with pytest.raises(TypeError, match="backend must be a str"):
        topk.ray.ShardedIndex.open(folder, backend=5)  # type: ignore[arg-type]


def test_concurrent_adds_with_automatic_ids_never_clash(ray_local, rng) -> None:
    s = topk.ray.ShardedIndex(D, shards=3, num_cpus=0)
    failures: list[BaseException] = []

    def add() -> None:
        try:
            for _ in range(10):
                s.add(rng.standard_normal((4, D)).astype(np.float32))
        except BaseException as e:
            failures.append(e)

    try:
        threads = [threading.Thread(target=add) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert len(s) == 160
        np.testing.assert_array_equal(s.ids(), np.arange(160))
    finally:
        s.close()


def test_a_failed_save_leaves_the_previous_save_whole(
    ray_local, tmp_path, rng, monkeypatch
) -> None:
    """The manifest cannot be written (a full disk): the save raises, the
    shard files it wrote go, the manifest and files of the save before
    stand, the shards keep their restart point, and the next save works."""
    folder = tmp_path / "set"
    s = topk.ray.ShardedIndex(D, metric="dot", shards=3, path=folder, num_cpus=0)
    try:
        rows = rng.standard_normal((60, D)).astype(np.float32)
        s.add(rows)
        s.save()
        before = topk._topk._read_manifest(folder)
        saved = {
            p.name: p.read_bytes()
            for p in folder.iterdir()
            if p.name.endswith(".topkidx") or p.name == "manifest.json"
        }
        s.add(rows[:7] + 1)
        generation = topk._topk._next_generation(folder)
        assert generation == before["generation"] + 1

        def full(path: object, manifest: object) -> bool:
            raise topk.IndexFileError(f"{path}: No space left on device")

        monkeypatch.setattr(topk.ray, "_write_manifest", full)
        with pytest.raises(topk.IndexFileError, match="No space left"):
            s.save()
        monkeypatch.undo()
        now = {
            p.name: p.read_bytes()
            for p in folder.iterdir()
            if p.name.endswith(".topkidx") or p.name == "manifest.json"
        }
        assert now == saved, "the failed save's files must go, the old ones stay"
        # A shard restarted now reopens the old file and replays its log.
        victim = s.actors[1]
        pid = ray.get(victim.pid.remote())
        ray.kill(victim, no_restart=False)
        # The kill is asynchronous: wait for the new process, then count.
        deadline = time.monotonic() + 60
        while ray.get(victim.pid.remote()) == pid and time.monotonic() < deadline:
            time.sleep(0.05)
        restarted(victim, pid)
        assert len(s) == 67
        s.save()
        after = topk._topk._read_manifest(folder)
        assert after["generation"] == generation
        assert sum(e["rows"] for e in after["shards"]) == 67
        names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".topkidx"))
        assert names == sorted(e["file"] for e in after["shards"])
    finally:
        s.close()
    again = topk.ray.ShardedIndex.open(folder, num_cpus=0)
    try:
        assert len(again) == 67
    finally:
        again.close()


def test_a_save_waits_for_the_folders_save_lock(ray_local, tmp_path, rng) -> None:
    """The Python set takes the lock the Rust ``ShardedIndex::save`` takes:
    while another writer holds it, a save waits."""
    folder = tmp_path / "locked"
    s = topk.ray.ShardedIndex(D, shards=2, path=folder, num_cpus=0)
    done = threading.Event()
    failures: list[BaseException] = []

    def save() -> None:
        try:
            s.save()
        except BaseException as e:
            failures.append(e)
        finally:
            done.set()

    try:
        s.add(rng.standard_normal((10, D)).astype(np.float32))
        with topk._topk._SaveLock(folder):
            worker = threading.Thread(target=save)
            worker.start()
            assert not done.wait(1.0), "the save ran while the folder was locked"
            assert not (folder / "manifest.json").exists()
        worker.join(60)
        assert done.is_set() and failures == []
        assert topk._topk._read_manifest(folder)["generation"] == 1
        assert (folder / ".topk-save.lock").exists()
    finally:
        s.close()
