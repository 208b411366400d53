"""topk.Index through the Python API: shapes, padding, conventions, inputs,
errors, files, threads, and bit-identity between the exact backends."""

from __future__ import annotations

import decimal
import errno
import pickle
import threading
import time

import numpy as np
import pytest

import topk
from conftest import same_bytes


def corpus(rng: np.random.Generator, n: int = 200, d: int = 16) -> np.ndarray:
    return rng.standard_normal((n, d), dtype=np.float32)


def test_backends_lists_the_host_backends() -> None:
    b = topk.backends()
    assert b["cpu"] is True and b["oracle"] is True
    for name, state in b.items():
        assert state is True or (isinstance(state, str) and state), name


def test_add_search_remove_as_in_the_readme() -> None:
    idx = topk.Index(2, metric="dot")
    rows = np.array([[1, 0], [0, 1], [0, 1]], dtype=np.float32)
    np.testing.assert_array_equal(idx.add(rows, ids=[7, 42, 3]), [7, 42, 3])
    scores, ids = idx.search(np.array([0, 1], dtype=np.float32), 2)
    np.testing.assert_array_equal(ids, [3, 42])
    np.testing.assert_array_equal(scores, [1.0, 1.0])
    np.testing.assert_array_equal(idx.add(np.array([[0.5, 0.5]], np.float32)), [43])
    assert idx.remove([3, 1000]) == 1
    assert len(idx) == 3
    _, ids = idx.search(np.array([0, 1], np.float32), 5, filter=np.array([7, 43]))
    np.testing.assert_array_equal(ids, [43, 7, -1, -1, -1])
    assert 42 in idx and 3 not in idx and -1 not in idx
    np.testing.assert_array_equal(idx.ids(), [7, 42, 43])
    np.testing.assert_array_equal(idx.get(42), [0.0, 1.0])
    assert idx.get(3) is None


def test_attributes_and_repr() -> None:
    idx = topk.Index(8, metric="L2", backend="Oracle", capacity=100)
    assert (idx.dim, idx.metric, idx.backend, len(idx)) == (8, "l2", "oracle", 0)
    assert repr(idx) == 'topk.Index(dim=8, metric="l2", backend="oracle", len=0)'


def test_auto_ids_start_at_zero_and_follow_the_largest(rng: np.random.Generator) -> None:
    idx = topk.Index(4)
    np.testing.assert_array_equal(idx.add(corpus(rng, 3, 4)), [0, 1, 2])
    idx.add(corpus(rng, 1, 4), ids=[100])
    np.testing.assert_array_equal(idx.add(corpus(rng, 2, 4)), [101, 102])


def test_auto_ids_reach_the_largest_id_and_stop_there() -> None:
    idx = topk.Index(2, metric="dot")
    idx.add(np.ones((1, 2), np.float32), ids=[topk.MAX_ID - 1])
    np.testing.assert_array_equal(idx.add(np.ones((1, 2), np.float32)), [topk.MAX_ID])
    assert topk.MAX_ID in idx and len(idx) == 2
    with pytest.raises(topk.InvalidInputError):
        idx.add(np.ones((1, 2), np.float32))
    assert len(idx) == 2
    assert 2**63 not in idx and -1 not in idx and 10**30 not in idx and np.int64(-1) not in idx
    with pytest.raises(TypeError):
        _ = "7" in idx
    for absent in [2**63, 2**64, 10**30, -1, np.int64(-1)]:
        assert idx.get(absent) is None, absent
    assert idx.get(np.uint64(topk.MAX_ID)) is not None
    with pytest.raises(TypeError):
        idx.get("7")


@pytest.mark.parametrize("bad", [1.9, decimal.Decimal("12.7"), "7"])
def test_object_ids_that_are_not_integers_are_refused_not_rounded(bad) -> None:
    idx = topk.Index(2, metric="dot")
    ids = np.array([3, bad], dtype=object)
    with pytest.raises(TypeError, match=r"ids\[1\] = .* is not an integer"):
        idx.add(np.ones((2, 2), np.float32), ids=ids)
    assert len(idx) == 0
    np.testing.assert_array_equal(
        idx.add(np.ones((2, 2), np.float32), ids=np.array([3, np.int64(12)], dtype=object)),
        [3, 12],
    )


def test_shapes_one_query_and_a_batch(rng: np.random.Generator) -> None:
    idx = topk.Index(16)
    idx.add(corpus(rng))
    q = corpus(rng, 3)
    scores, ids = idx.search(q, 5)
    assert scores.shape == ids.shape == (3, 5)
    one_s, one_i = idx.search(q[1], 5)
    assert one_s.shape == one_i.shape == (5,)
    same_bytes((one_s, one_i), (scores[1], ids[1]))


def test_padding_when_fewer_rows_than_k() -> None:
    idx = topk.Index(2, metric="dot")
    idx.add(np.eye(2, dtype=np.float32))
    scores, ids = idx.search(np.ones((2, 2), np.float32), 4)
    np.testing.assert_array_equal(ids, [[0, 1, -1, -1], [0, 1, -1, -1]])
    assert np.all(np.isneginf(scores[:, 2:]))
    empty = topk.Index(3)
    scores, ids = empty.search(np.ones(3, np.float32), 2)
    np.testing.assert_array_equal(ids, [-1, -1])
    assert np.all(np.isneginf(scores))


def test_l2_returns_squared_distances_ascending() -> None:
    idx = topk.Index(2, metric="l2")
    idx.add(np.array([[0, 0], [3, 4], [1, 0]], np.float32))
    dist, ids = idx.search(np.array([0, 0], np.float32), 4)
    np.testing.assert_array_equal(ids, [0, 2, 1, -1])
    np.testing.assert_array_equal(dist, [0.0, 1.0, 25.0, np.inf])
    # An exact match is +0.0, not -0.0.
    assert not np.signbit(dist[0])


def test_equal_scores_rank_by_the_smaller_id(rng: np.random.Generator) -> None:
    ids = rng.permutation(1000)[:50].astype(np.int64)
    rows = np.tile(np.array([[1.0, 2.0, 3.0]], np.float32), (50, 1))
    idx = topk.Index(3, metric="dot")
    idx.add(rows, ids=ids)
    scores, got = idx.search(np.array([1, 1, 1], np.float32), 10)
    np.testing.assert_array_equal(got, np.sort(ids)[:10])
    assert len(set(scores.view(np.uint32).tolist())) == 1


@pytest.mark.parametrize("metric", ["cosine", "dot", "l2"])
def test_cpu_and_oracle_are_the_same_bytes(rng: np.random.Generator, metric: str) -> None:
    rows = corpus(rng, 500, 37)
    ids = rng.permutation(10_000)[:500].astype(np.int64)
    # Ties: some rows repeated under other ids.
    rows[100:120] = rows[0]
    cpu = topk.Index(37, metric=metric, backend="cpu")
    oracle = topk.Index(37, metric=metric, backend="oracle")
    cpu.add(rows, ids=ids)
    oracle.add(rows, ids=ids)
    q = np.vstack([rows[:4], corpus(rng, 8, 37)])
    same_bytes(cpu.search(q, 25), oracle.search(q, 25))
    allowed = ids[::3]
    same_bytes(cpu.search(q, 25, filter=allowed), oracle.search(q, 25, filter=allowed))
    per = [ids[i::7] for i in range(len(q))]
    same_bytes(cpu.search(q, 600, filter=per), oracle.search(q, 600, filter=per))


@pytest.mark.parametrize("metric", ["cosine", "dot", "l2"])
def test_the_certified_path_returns_the_oracles_bytes(
    rng: np.random.Generator, metric: str
) -> None:
    # 2**20 values and more: single queries take the int8 path once the
    # state is prepared; batches of 16 or more build it themselves.
    n, d = 53_000, 20
    rows = np.round(rng.standard_normal((n, d), dtype=np.float32) * 2)
    ids = rng.permutation(np.unique(rng.integers(0, 1 << 40, 2 * n))[:n])
    cpu = topk.Index(d, metric=metric, backend="cpu")
    oracle = topk.Index(d, metric=metric, backend="oracle")
    cpu.add(rows, ids=ids)
    oracle.add(rows, ids=ids)
    q = np.vstack([rows[:3], rng.standard_normal((17, d), dtype=np.float32)])
    assert cpu.certified_coverage is None
    same_bytes(cpu.search(q[:2], 10), oracle.search(q[:2], 10))
    assert cpu.certified_coverage is None
    cpu.prepare_certified()
    assert cpu.certified_coverage == n
    same_bytes(cpu.search(q[0], 10), oracle.search(q[0], 10))
    same_bytes(cpu.search(q, 50), oracle.search(q, 50))
    allowed = ids[::2]
    same_bytes(cpu.search(q, 50, filter=allowed), oracle.search(q, 50, filter=allowed))
    cpu.add(rows[:5], ids=(1 << 41) + np.arange(5))
    oracle.add(rows[:5], ids=(1 << 41) + np.arange(5))
    assert cpu.certified_coverage == n + 5
    same_bytes(cpu.search(q, 50), oracle.search(q, 50))


def test_filters_shared_and_per_query() -> None:
    idx = topk.Index(1, metric="dot")
    idx.add(np.arange(1, 11, dtype=np.float32)[:, None])
    q = np.ones((2, 1), np.float32)
    _, ids = idx.search(q, 3, filter=[0, 1, 2, 9])
    np.testing.assert_array_equal(ids, [[9, 2, 1], [9, 2, 1]])
    _, ids = idx.search(q, 2, filter=[np.array([3]), [4, 5, -1, 99]])
    np.testing.assert_array_equal(ids, [[3, -1], [5, 4]])
    _, ids = idx.search(q, 1, filter=np.array([[1, 2], [7, 3]]))
    np.testing.assert_array_equal(ids, [[2], [7]])
    _, ids = idx.search(q[0], 2, filter=[[6]])
    np.testing.assert_array_equal(ids, [6, -1])
    _, ids = idx.search(q, 2, filter=np.array([], dtype=np.int64))
    np.testing.assert_array_equal(ids, [[-1, -1], [-1, -1]])


def test_ids_no_index_can_hold_are_ignored_by_remove_and_filters() -> None:
    """Ids above 2^63 - 1 are absent from every index: ``remove`` and
    filters ignore them as they ignore negative ids, where ``add`` refuses
    them naming the value."""
    idx = topk.Index(1, metric="dot")
    idx.add(np.arange(1, 6, dtype=np.float32)[:, None])
    big = np.array([2**63, 2**64 - 1, 3], np.uint64)
    q = np.ones((2, 1), np.float32)
    _, ids = idx.search(q, 2, filter=big)
    np.testing.assert_array_equal(ids, [[3, -1], [3, -1]])
    _, ids = idx.search(q, 2, filter=[[2**64, 1], np.array([2**63], np.uint64)])
    np.testing.assert_array_equal(ids, [[1, -1], [-1, -1]])
    assert idx.remove(np.array([2**63], np.uint64)) == 0
    assert idx.remove([2**70, -5, 4]) == 1
    np.testing.assert_array_equal(idx.ids(), [0, 1, 2, 3])
    for bad in ([2**64], [5, 2**70]):
        with pytest.raises(
            topk.InvalidInputError, match=rf"id {bad[-1]} at position {len(bad) - 1}"
        ):
            idx.add(np.ones((len(bad), 1), np.float32), ids=bad)
    assert len(idx) == 4


def test_a_list_of_numpy_integer_scalars_is_one_shared_filter() -> None:
    idx = topk.Index(1, metric="dot")
    idx.add(np.arange(1, 11, dtype=np.float32)[:, None])
    q = np.ones((2, 1), np.float32)
    want = idx.search(q, 3, filter=[2, 9])
    allowed = np.array([2, 9])
    for f in ([np.int64(2), np.int64(9)], list(allowed), tuple(allowed), [np.uint8(2), 9]):
        same_bytes(idx.search(q, 3, filter=f), want)
    # Three scalars for two queries are still one list of ids.
    same_bytes(
        idx.search(q, 3, filter=list(np.array([2, 9, 5]))), idx.search(q, 3, filter=[2, 9, 5])
    )


def test_float32_c_contiguous_is_read_in_place(rng: np.random.Generator) -> None:
    idx = topk.Index(16)
    rows = corpus(rng)
    before = topk.copy_count()
    idx.add(rows)
    idx.search(rows[:4], 3)
    idx.search(rows[5], 3)
    idx.upsert(rows[:2], np.array([0, 1]))
    assert topk.copy_count() == before


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a.astype(np.float64),
        lambda a: a.astype(np.float16),
        lambda a: np.asfortranarray(a),
        lambda a: np.repeat(a, 2, axis=1)[:, ::2],
        lambda a: a.tolist(),
    ],
    ids=["float64", "float16", "fortran", "strided", "list"],
)
def test_other_layouts_are_converted_once(rng: np.random.Generator, make) -> None:
    idx = topk.Index(16, metric="dot")
    rows = corpus(rng).astype(np.float16).astype(np.float32)
    idx.add(rows)
    q = rows[:3]
    want = idx.search(q, 4)
    before = topk.copy_count()
    same_bytes(idx.search(make(q), 4), want)
    assert topk.copy_count() == before + 1


def misaligned(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``a`` whose data starts one byte past an
    element boundary."""
    buf = np.zeros(a.nbytes + 1, np.uint8)
    out = np.ndarray(a.shape, a.dtype, buffer=buf, offset=1)
    out[...] = a
    assert out.flags.c_contiguous and not out.flags.aligned
    return out


def test_misaligned_arrays_are_copied_once_not_refused(rng: np.random.Generator) -> None:
    idx = topk.Index(16, metric="dot")
    rows = corpus(rng)
    idx.add(misaligned(rows), ids=misaligned(np.arange(200, dtype=np.int64)))
    q = rows[:2]
    want = idx.search(q, 3)
    before = topk.copy_count()
    same_bytes(idx.search(misaligned(q), 3), want)
    assert topk.copy_count() == before + 1
    allowed = np.array([5, 9, 11], np.int64)
    same_bytes(idx.search(q, 3, filter=misaligned(allowed)), idx.search(q, 3, filter=allowed))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_, np.complex64])
def test_non_float_dtypes_are_a_type_error_naming_it(dtype) -> None:
    idx = topk.Index(2)
    with pytest.raises(TypeError, match=f"got dtype {np.dtype(dtype)}"):
        idx.search(np.ones(2, dtype=dtype), 1)
    with pytest.raises(TypeError, match=f"got dtype {np.dtype(dtype)}"):
        idx.add(np.ones((1, 2), dtype=dtype))


def test_ids_must_be_integers() -> None:
    idx = topk.Index(2)
    with pytest.raises(TypeError, match="got dtype float64"):
        idx.add(np.ones((1, 2), np.float32), ids=[1.5])
    idx.add(np.ones((1, 2), np.float32), ids=np.array([5], dtype=np.uint8))
    assert 5 in idx


def error(fn) -> BaseException:
    with pytest.raises(topk.TopkError) as info:
        fn()
    return info.value


def test_every_input_error_is_a_value_error_naming_the_value() -> None:
    idx = topk.Index(2, metric="dot")
    idx.add(np.eye(2, dtype=np.float32), ids=[10, 20])
    ok = np.ones((1, 2), np.float32)
    cases = {
        "query 0 has 3 values": lambda: idx.search(np.ones(3, np.float32), 1),
        "K = 0": lambda: idx.search(np.ones(2, np.float32), 0),
        "k = -2": lambda: idx.search(np.ones(2, np.float32), -2),
        "NaN": lambda: idx.search(np.array([np.nan, 0], np.float32), 1),
        "inf": lambda: idx.add(np.array([[np.inf, 0]], np.float32)),
        "rows of 3 values": lambda: idx.add(np.ones((1, 3), np.float32)),
        "id 10 at position 0 is already": lambda: idx.add(ok, ids=[10]),
        "id 7 is given twice": lambda: idx.upsert(np.ones((2, 2), np.float32), [7, 7]),
        "id -4 at position 1 is negative": lambda: idx.add(np.ones((2, 2), np.float32), [1, -4]),
        "id 18446744073709551615 at position 0 is above": lambda: idx.add(
            ok, ids=np.array([2**64 - 1], np.uint64)
        ),
        "2 ids for 1 rows": lambda: idx.add(ok, ids=[1, 2]),
        "3 filters for 2 queries": lambda: idx.search(np.ones((2, 2), np.float32), 1, [[1]] * 3),
        "dim must be at least 1, got dim = -1": lambda: topk.Index(-1),
        "dimension": lambda: topk.Index(0),
        "metric": lambda: topk.Index(2, metric="hamming"),
        'unknown backend "gpu9"': lambda: topk.Index(2, backend="gpu9"),
        "got shape (1, 1, 2)": lambda: idx.search(np.ones((1, 1, 2), np.float32), 1),
        "option m must be a non-negative integer, got -3": lambda: topk.Index(2, m=-3),
    }
    for needle, fn in cases.items():
        e = error(fn)
        assert isinstance(e, topk.InvalidInputError), (needle, e)
        assert isinstance(e, ValueError)
        assert needle.lower() in str(e).lower(), (needle, str(e))
    # Failed mutations changed nothing.
    np.testing.assert_array_equal(idx.ids(), [10, 20])


def test_hnsw_options_are_checked_on_every_backend() -> None:
    for backend in ("cpu", "oracle"):
        with pytest.raises(topk.InvalidInputError, match="invalid HNSW parameter m = 1"):
            topk.Index(4, backend=backend, m=1)
    assert topk.Index(4, backend="cpu", m=8).backend == "cpu"


def test_unknown_option_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match='unknown option "colour"'):
        topk.Index(4, colour=3)
    with pytest.raises(TypeError, match="option parallel must be a bool, got 3"):
        topk.Index(4, parallel=3)
    with pytest.raises(TypeError, match="option m must be an integer, got a bool"):
        topk.Index(4, m=True)
    # Not an integer at all: a TypeError too (never rounded, never parsed).
    with pytest.raises(TypeError, match=r"option capacity must be an integer, got 10\.0 \(float\)"):
        topk.Index(4, capacity=10.0)
    with pytest.raises(TypeError, match="option m must be an integer, got '8' \\(str\\)"):
        topk.Index(4, m="8")
    assert topk.Index(4, capacity=np.int64(10), m=np.uint8(8)).dim == 4
    # Every option is accepted by every backend.
    idx = topk.Index(4, capacity=10, m=8, ef_construction=20, ef=10, seed=1, parallel=False)
    idx = topk.Index(4, device=0, max_k=100, max_batch=8, streams=2, ef_search=5)
    assert len(idx) == 0


def test_save_open_round_trip(tmp_path, rng: np.random.Generator) -> None:
    idx = topk.Index(16, metric="cosine")
    ids = idx.add(corpus(rng))
    idx.remove(ids[::5])
    path = tmp_path / "docs.topkidx"
    idx.save(path)
    q = corpus(rng, 5)
    for backend in [None, "cpu", "oracle"]:
        back = topk.Index.open(str(path), backend=backend)
        assert back.backend == (backend or "cpu")
        same_bytes(back.search(q, 10), idx.search(q, 10))


def test_file_errors_are_os_errors_with_the_rust_message(tmp_path) -> None:
    missing = tmp_path / "missing.topkidx"
    e = error(lambda: topk.Index.open(missing))
    assert isinstance(e, topk.IndexFileError) and isinstance(e, OSError)
    assert e.errno == errno.ENOENT and e.filename == str(missing)
    assert str(e).startswith(f"{missing}: cannot open")
    # Whole through pickle, as a Ray shard's error reaches the driver.
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is topk.IndexFileError and str(back) == str(e)
    assert back.errno == errno.ENOENT and back.filename == str(missing)

    idx = topk.Index(4)
    idx.add(np.ones((3, 4), np.float32))
    good = tmp_path / "good.topkidx"
    idx.save(good)
    data = good.read_bytes()

    cases = {
        "truncated": data[: len(data) // 2],
        "not a topk index file": b"NOTANIDX" + data[8:],
        "checksum mismatch": data[:-9] + bytes([data[-9] ^ 0xFF]) + data[-8:],
        "unexpected bytes after the end": data + b"xx",
    }
    for needle, content in cases.items():
        bad = tmp_path / f"{needle.replace(' ', '_')}.topkidx"
        bad.write_bytes(content)
        e = error(lambda bad=bad: topk.Index.open(bad))
        assert isinstance(e, topk.IndexFileError) and isinstance(e, OSError), needle
        assert needle in str(e) and str(bad) in str(e), (needle, str(e))
        assert e.filename == str(bad) and e.errno is None

    e = error(lambda: idx.save(tmp_path / "no" / "such" / "dir" / "x.topkidx"))
    assert isinstance(e, topk.IndexFileError) and e.errno == errno.ENOENT


def test_a_cuda_tensor_on_a_host_index_says_so() -> None:
    class FakeCuda:
        __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0, False)}  # noqa: RUF012
        device = "cuda:0"

    idx = topk.Index(2)
    e = error(lambda: idx.search(FakeCuda(), 1))
    assert isinstance(e, topk.InvalidInputError)
    assert "CUDA tensor" in str(e) and "'cpu'" in str(e)


def test_dlpack_and_array_protocol_objects(rng: np.random.Generator) -> None:
    idx = topk.Index(16, metric="dot")
    rows = corpus(rng)
    idx.add(rows)
    want = idx.search(rows[:2], 3)

    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return rows[:2]

    class DlpackOnly:
        def __dlpack__(self, **kwargs):
            return rows[:2].__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return rows.__dlpack_device__()

    same_bytes(idx.search(ArrayLike(), 3), want)
    same_bytes(idx.search(DlpackOnly(), 3), want)


def test_many_threads_search_while_one_writes(rng: np.random.Generator) -> None:
    d = 32
    rows = np.abs(corpus(rng, 2000, d))
    idx = topk.Index(d, metric="dot")
    idx.add(rows)
    queries = np.abs(corpus(rng, 64, d))
    want = idx.search(queries, 10)
    failures: list[BaseException] = []
    stop = threading.Event()

    def searcher() -> None:
        try:
            for i in range(40):
                got = idx.search(queries[i % 8 :: 8], 10)
                same_bytes(got, (want[0][i % 8 :: 8], want[1][i % 8 :: 8]))
        except BaseException as e:
            failures.append(e)

    def writer() -> None:
        # Rows that score below every original one (negative dot products)
        # come and go; the results above must never change.
        try:
            n = 0
            while not stop.is_set() and n < 200:
                ids = np.arange(10_000 + 10 * n, 10_010 + 10 * n)
                idx.upsert(-np.abs(corpus(rng, 10, d)), ids)
                idx.remove(ids[::2])
                n += 1
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=searcher) for _ in range(6)]
    w = threading.Thread(target=writer)
    for t in [*threads, w]:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    w.join()
    assert failures == []
    assert len(idx) > 2000


def test_a_call_waiting_for_a_long_write_lets_other_threads_run() -> None:
    # A long hnsw add holds the write lock; `len(idx)` from a second thread
    # waits for it without the GIL, so this thread keeps running meanwhile.
    d = 32
    rng = np.random.default_rng(5)
    idx = topk.Index(d, metric="dot", backend="hnsw", ef_construction=200, parallel=False)
    rows = rng.standard_normal((20_000, d), dtype=np.float32)
    writing = threading.Thread(target=idx.add, args=(rows,))
    reader_done = threading.Event()
    span: list[float] = []
    seen: list[int] = []

    def reader() -> None:
        try:
            start = time.perf_counter()
            seen.append(len(idx))
            span.extend([start, time.perf_counter()])
        finally:
            reader_done.set()

    writing.start()
    time.sleep(0.05)
    assert writing.is_alive(), "the add ended before the reader started"
    threading.Thread(target=reader).start()
    ticks = [time.perf_counter()]
    deadline = ticks[0] + 600
    while not reader_done.is_set():
        assert time.perf_counter() < deadline, "the reader did not return in 10 minutes"
        time.sleep(0.001)
        ticks.append(time.perf_counter())
    writing.join()
    assert seen == [20_000], f"the reader saw {seen} rows"
    wait = span[1] - span[0]
    assert wait > 0.2, f"the reader waited only {wait:.3f} s: the add was too short to tell"
    inside = [t for t in ticks if span[0] <= t <= span[1]]
    gaps = np.diff([span[0], *inside, span[1]])
    # Holding the GIL while waiting would leave one gap as long as the wait.
    assert gaps.max() < wait / 4, f"largest gap {gaps.max():.3f} s of a {wait:.3f} s wait"


def test_an_unavailable_backend_is_a_device_error_saying_why() -> None:
    unavailable = {n: why for n, why in topk.backends().items() if why is not True}
    if not unavailable:
        pytest.skip("every backend of this build runs here")
    for name, why in unavailable.items():
        e = error(lambda name=name: topk.Index(4, backend=name))
        assert isinstance(e, topk.DeviceError) and isinstance(e, RuntimeError)
        assert why in str(e) and name in str(e)
