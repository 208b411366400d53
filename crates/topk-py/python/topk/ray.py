"""Exact top-K over shards held by Ray actors: one index spread over processes
or machines, returning the bytes one :class:`topk.Index` over the union would.

::

    import ray
    import topk.ray

    ray.init()
    idx = topk.ray.ShardedIndex(384, metric="cosine", shards=4, path="/shared/docs")
    ids = idx.add(vectors)
    scores, ids = idx.search(queries, k=10)
    idx.save()                                   # manifest.json + one Index file per shard
    idx2 = topk.ray.ShardedIndex.open("/shared/docs")

**Placement.** Row ``id`` lives on shard :func:`topk.shard_of` ``(id, shards)``
(the rule ``topk._topk.PLACEMENT``, shared with the Rust ``ShardedIndex``), so
an add, an upsert, a remove, ``get`` and ``in`` of an id reach one shard. A
search goes to every shard (in parallel: every call is submitted, then
awaited) and the per-shard results are merged by :func:`topk.merge`, which
copies the hits, never rescores them: with an exact backend a search returns
the same bytes as one ``topk.Index`` over the same (id, vector) pairs.

**All or nothing.** A mutation's whole input is checked in the driver first,
with ``topk.Index``'s own rules and exception classes (a dry run on an empty
index); a shard that still refuses (an id already present) makes the shards
that applied their part undo it before the error is raised.

**Restarts.** Actors are created with ``max_restarts=-1`` and
``max_task_retries=-1``. Each keeps its shard durable in the set's folder
(``path``, or a temporary folder): its index file from the last save plus a
write-ahead log of every mutation since (one record per mutation, appended,
flushed and fsynced before the call returns, with a CRC-32; a torn last
record is ignored). A restarted actor reopens its file and replays its log;
every mutation carries the driver's sequence number, so one retried after a
restart is applied once. The folder must be reachable at the same path from
every node that runs a shard (a shared file system) when Ray spans machines.

``import topk.ray`` does not import Ray; the first :class:`ShardedIndex`
does, and says ``pip install ray`` when it is missing.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import struct
import tempfile
import threading
import uuid
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import _inputs
from ._topk import (
    MANIFEST_FILE,
    MAX_ID,
    Index,
    _read_manifest,
    _remove_stale,
    _shard_file_name,
    _write_manifest,
    merge,
    shard_of,
)
from .errors import IndexFileError, InvalidInputError

__all__ = ["ShardedIndex"]

_LOG_FOLDER = ".topk-ray-logs"
# Each log record: payload length, CRC-32 of the payload, then the payload.
_RECORD = struct.Struct("<II")
# A query array above this size goes to the object store once per search,
# not once per shard.
_PUT_BYTES = 1 << 17
# How many mutation results an actor keeps for retried calls.
_KEEP_RESULTS = 16


def _ray() -> Any:
    """The ``ray`` module, or an ImportError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError(
            "topk.ray needs Ray, which is not installed here: pip install ray"
        ) from None
    return ray


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_log(path: Path) -> list[Any]:
    """The records of the log at ``path``; a torn last record (a crash while
    it was written) is cut off the file. A bad record before the last is an
    :class:`IndexFileError` naming its offset."""
    data = path.read_bytes()
    records: list[Any] = []
    offset = 0
    while offset < len(data):
        end = offset + _RECORD.size
        if end > len(data):
            break
        length, crc = _RECORD.unpack_from(data, offset)
        if end + length > len(data):
            break
        payload = data[end : end + length]
        if zlib.crc32(payload) != crc:
            if end + length == len(data):
                break
            raise IndexFileError(f"{path}: the log record at byte {offset} fails its CRC-32 check")
        records.append(pickle.loads(payload))
        offset = end + length
    if offset < len(data):
        with open(path, "r+b") as f:
            f.truncate(offset)
            f.flush()
            os.fsync(f.fileno())
    return records


def _encode(record: Any) -> bytes:
    payload = pickle.dumps(record, protocol=5)
    return _RECORD.pack(len(payload), zlib.crc32(payload)) + payload


class _Shard:
    """One shard: a :class:`topk.Index` in a Ray actor, made durable by its
    base file and its write-ahead log (the module documentation says how)."""

    def __init__(self, shard: int, shards: int, log_path: str, init: dict[str, Any]) -> None:
        self._shard = shard
        self._shards = shards
        self._log_path = Path(log_path)
        self._results: dict[int, Any] = {}
        self._undo: tuple[int, tuple[str, Any] | None] = (0, None)
        self._seq = 0
        self._error: BaseException | None = None
        self._log: Any = None
        try:
            if self._log_path.exists():
                records = _read_log(self._log_path)
                if not records or records[0][0] != "base":
                    raise IndexFileError(f"{self._log_path}: the log has no base record")
                _, base, self._seq = records[0]
                self._open(base)
                for i, record in enumerate(records[1:], start=2):
                    _, seq, op, args = record
                    # Only the last mutation can still be undone by the driver.
                    last = i == len(records)
                    self._record(seq, *self._apply(op, args, undoable=last))
            else:
                self._open(init)
                self._write_base(init)
            self._log = open(self._log_path, "ab")  # noqa: SIM115 (held for the actor's life)
        except Exception as e:
            # Ray reports a constructor's exception as the actor's death, not
            # as the exception itself: kept and raised by every later call,
            # the driver sees topk's own error class and message.
            self._error = e

    def _open(self, init: dict[str, Any]) -> None:
        self._init = dict(init)
        file = init.get("file")
        if file is None:
            self._index = Index(
                init["dim"], init["metric"], init["backend"], **init.get("options", {})
            )
            return
        self._index = Index.open(file, backend=init.get("backend"))
        if self._index.dim != init["dim"] or self._index.metric != init["metric"]:
            raise IndexFileError(
                f"{file}: shard {self._shard} has D = {self._index.dim} and metric "
                f"{self._index.metric!r}, the set has D = {init['dim']} and {init['metric']!r}"
            )
        rows = init.get("rows")
        if rows is not None and len(self._index) != rows:
            raise IndexFileError(
                f"{file}: shard {self._shard} holds {len(self._index)} rows, "
                f"the manifest says {rows}"
            )
        ids = self._index.ids()
        if ids.size:
            wrong = np.flatnonzero(shard_of(ids, self._shards) != self._shard)
            if wrong.size:
                raise IndexFileError(
                    f"{file}: shard {self._shard} holds id {int(ids[wrong[0]])}, which the "
                    f"placement rule puts on shard {int(shard_of(ids[wrong[:1]], self._shards)[0])}"
                )

    def _write_base(self, base: dict[str, Any]) -> None:
        """Starts a fresh log whose first record is ``base`` (atomically)."""
        tmp = self._log_path.with_name(self._log_path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(_encode(("base", base, self._seq)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._log_path)
        _fsync_folder(self._log_path.parent)

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def _record(self, seq: int, result: Any, inverse: tuple[str, Any] | None) -> None:
        self._seq = seq
        self._results[seq] = result
        for old in [s for s in self._results if s <= seq - _KEEP_RESULTS]:
            del self._results[old]
        self._undo = (seq, inverse)

    def _apply(self, op: str, args: Any, undoable: bool) -> tuple[Any, tuple[str, Any] | None]:
        """Applies one mutation; returns its result and, when ``undoable``,
        the mutation that undoes it."""
        index = self._index
        if op == "add":
            rows, ids = args
            index.add(rows, ids=ids)
            return None, ("restore", (ids, None, None)) if undoable else None
        if op == "upsert":
            rows, ids = args
            inverse = self._prior(ids) if undoable else None
            index.upsert(rows, ids)
            return None, inverse
        if op == "remove":
            inverse = self._prior(args) if undoable else None
            return index.remove(args), inverse
        if op == "restore":
            remove, rows, ids = args
            if remove is not None and len(remove):
                index.remove(remove)
            if ids is not None and len(ids):
                index.upsert(rows, ids)
            return None, None
        raise InvalidInputError(f"unknown shard operation {op!r}")

    def _prior(self, ids: np.ndarray) -> tuple[str, Any]:
        """The mutation that puts the rows of ``ids`` back as they are now."""
        index = self._index
        unique = np.unique(ids)
        present = np.array([int(i) in index for i in unique], dtype=bool)
        kept = unique[present]
        rows = np.stack([index.get(int(i)) for i in kept]) if kept.size else None
        return ("restore", (unique[~present], rows, kept))

    def mutate(self, seq: int, op: str, args: Any, undoable: bool) -> Any:
        """Applies mutation ``seq`` once: a retried call returns the stored
        result. ``op == "undo"`` undoes mutation ``args`` if it was the last."""
        self._check()
        if seq <= self._seq:
            return self._results.get(seq)
        if op == "undo":
            last, inverse = self._undo
            if last != args or inverse is None:
                self._record(seq, None, None)
                return None
            op, args = inverse
        result, inverse = self._apply(op, args, undoable)
        self._log.write(_encode(("mut", seq, op, args)))
        self._log.flush()
        os.fsync(self._log.fileno())
        self._record(seq, result, inverse)
        return result

    def search(self, queries: np.ndarray, k: int, filter: Any) -> Any:
        """The shard's ``Index.search``."""
        self._check()
        return self._index.search(queries, k, filter)

    def info(self) -> tuple[int, str, str, int]:
        """``(dim, metric, backend, len)``."""
        self._check()
        i = self._index
        return i.dim, i.metric, i.backend, len(i)

    def pid(self) -> int:
        """The actor's process id (a restart changes it)."""
        return os.getpid()

    def size(self) -> int:
        """Live rows."""
        self._check()
        return len(self._index)

    def max_id(self) -> int:
        """The largest live id, or -1."""
        self._check()
        ids = self._index.ids()
        return int(ids[-1]) if ids.size else -1

    def ids(self) -> np.ndarray:
        """The live ids, ascending."""
        self._check()
        return self._index.ids()

    def get(self, id: int) -> np.ndarray | None:
        """The vector of ``id``, or None."""
        self._check()
        return self._index.get(id)

    def contains(self, id: int) -> bool:
        """Whether ``id`` is live."""
        self._check()
        return id in self._index

    def compact(self) -> None:
        """The shard's ``Index.compact``."""
        self._check()
        self._index.compact()

    def save(self, file: str, rebase: bool) -> tuple[int, str]:
        """Saves the shard to ``file``; with ``rebase`` that file becomes the
        shard's base and its log starts again. Returns ``(rows, backend)``."""
        self._check()
        self._index.save(file)
        if rebase:
            base = {**self._init, "file": file, "backend": self._index.backend, "rows": None}
            self._log.close()
            self._write_base(base)
            self._init = base
            self._log = open(self._log_path, "ab")  # noqa: SIM115
        return len(self._index), self._index.backend

    def close(self) -> None:
        """Deletes the log (the set is closed for good)."""
        if self._log is not None:
            self._log.close()
        self._log_path.unlink(missing_ok=True)


_actor_lock = threading.Lock()
_actor_class: Any = None


def _actor() -> Any:
    """``_Shard`` as a Ray actor class (made once, when first needed)."""
    global _actor_class
    with _actor_lock:
        if _actor_class is None:
            _actor_class = _ray().remote(_Shard)
        return _actor_class


def _cause(error: BaseException) -> BaseException:
    """The exception a shard raised, out of Ray's wrapper."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def _rows(vectors: Any, backend: str) -> np.ndarray:
    """``vectors`` as a float32 C-contiguous ``(n, D)`` array (1-D: one row)."""
    rows = _inputs.host_float32(vectors, "vectors", backend)
    return rows.reshape(1, -1) if rows.ndim == 1 else rows


def _capacity(value: Any) -> int:
    """The ``capacity`` option checked as ``topk.Index`` checks it."""
    if isinstance(value, bool):
        raise TypeError(f"option capacity must be an integer, got a bool ({value})")
    if not isinstance(value, int | np.integer) or value < 0:
        raise InvalidInputError(f"option capacity must be a non-negative integer, got {value!r}")
    return int(value)


class ShardedIndex:
    """An exact top-K index over ``shards`` Ray actors, each holding one
    :class:`topk.Index` (see the module documentation for the rules).

    ``ShardedIndex(dim, metric="cosine", backend="cpu", shards=N, path=None,
    num_gpus=0, num_cpus=None, **options)``: ``backend`` and ``options`` are
    each shard's (``capacity`` is the whole set's and is split between the
    shards); ``num_gpus`` and ``num_cpus`` are each actor's Ray resources
    (``backend="cuda", num_gpus=1`` gives each shard a GPU of its own;
    ``num_cpus=None`` keeps Ray's default). ``path`` is the set's folder:
    its shard logs live there and :meth:`save` writes there by default; a
    folder that already holds a saved set is refused (open it with
    :meth:`open`). ``path=None`` keeps the logs in a temporary folder that
    :meth:`close` deletes.

    Every method and return value is :class:`topk.Index`'s: ``add``,
    ``upsert``, ``remove``, ``search``, ``save``, ``open``, ``compact``,
    ``ids``, ``get``, ``len``, ``in``, ``dim``, ``metric``, ``backend``; and
    the errors are the same classes. One driver mutates a set at a time;
    searches may run from several threads.
    """

    def __init__(
        self,
        dim: int,
        metric: str = "cosine",
        backend: str = "cpu",
        *,
        shards: int,
        path: str | os.PathLike[str] | None = None,
        num_gpus: float = 0,
        num_cpus: float | None = None,
        **options: Any,
    ) -> None:
        n = self._shard_count(shards)
        options = dict(options)
        capacity = _capacity(options.pop("capacity", 0))
        # The checks of topk.Index (dim, metric, backend name, options), run
        # here; a cuda shard's own device is checked by its actor.
        probe_backend = "cpu" if str(backend).lower() == "cuda" else backend
        probe = Index(dim, metric, probe_backend, **options)
        backend = "cuda" if str(backend).lower() == "cuda" else probe.backend
        if capacity:
            options["capacity"] = -(-capacity // n)
        folder, owned = self._folder(path)
        init = {
            "file": None,
            "dim": probe.dim,
            "metric": probe.metric,
            "backend": backend,
            "options": options,
        }
        self._start(folder, owned, [dict(init) for _ in range(n)], num_gpus, num_cpus)

    @staticmethod
    def _shard_count(shards: Any) -> int:
        if isinstance(shards, bool) or not isinstance(shards, int | np.integer) or shards < 1:
            raise InvalidInputError(f"shards must be an integer of at least 1, got {shards!r}")
        return int(shards)

    @staticmethod
    def _folder(path: str | os.PathLike[str] | None) -> tuple[Path, bool]:
        if path is None:
            return Path(tempfile.mkdtemp(prefix="topk-ray-")), True
        folder = Path(path).absolute()
        if (folder / MANIFEST_FILE).exists():
            raise InvalidInputError(
                f"{folder} already holds a saved set: open it with ShardedIndex.open"
            )
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise IndexFileError(f"could not create the set's folder {folder}: {e}") from None
        return folder, False

    def _start(
        self,
        folder: Path,
        owned: bool,
        inits: list[dict[str, Any]],
        num_gpus: float,
        num_cpus: float | None,
    ) -> None:
        ray = _ray()
        self._ray = ray
        self._path = folder
        self._owned = owned
        self._closed = False
        self._lock = threading.Lock()
        self._seq = 0
        self._dim = int(inits[0]["dim"])
        self._metric = str(inits[0]["metric"])
        session = uuid.uuid4().hex[:12]
        logs = folder / _LOG_FOLDER
        logs.mkdir(parents=True, exist_ok=True)
        resources: dict[str, Any] = {
            "max_restarts": -1,
            "max_task_retries": -1,
            "num_gpus": num_gpus,
        }
        if num_cpus is not None:
            resources["num_cpus"] = num_cpus
        cls = _actor().options(**resources)
        n = len(inits)
        self._actors = [
            cls.remote(i, n, str(logs / f"{session}-shard-{i:04d}.log"), init)
            for i, init in enumerate(inits)
        ]
        try:
            infos = self._get([a.info.remote() for a in self._actors])
        except BaseException:
            self._shutdown()
            raise
        self._backend = str(infos[0][2])

    # -- fan-out ------------------------------------------------------------

    def _get(self, refs: Sequence[Any]) -> list[Any]:
        """Every result of ``refs`` (all awaited); the first shard's error, as
        the shard raised it, when any failed."""
        results: list[Any] = []
        first: BaseException | None = None
        for ref in refs:
            try:
                results.append(self._ray.get(ref))
            except self._ray.exceptions.RayTaskError as e:
                results.append(None)
                first = first or _cause(e)
        if first is not None:
            raise first
        return results

    def _live(self) -> None:
        if self._closed:
            raise InvalidInputError("this ShardedIndex is closed")

    def _route(self, ids: np.ndarray) -> list[np.ndarray]:
        """The positions of ``ids`` that each shard holds."""
        n = len(self._actors)
        if n == 1:
            return [np.arange(ids.size)]
        owner = shard_of(ids, n)
        order = np.argsort(owner, kind="stable")
        bounds = np.searchsorted(owner[order], np.arange(n + 1))
        return [order[bounds[s] : bounds[s + 1]] for s in range(n)]

    def _mutate(self, op: str, parts: list[Any]) -> list[Any]:
        """Applies ``op`` with ``parts[s]`` on each shard ``s`` whose part is
        not None, all or nothing; returns the shards' results."""
        with self._lock:
            self._live()
            self._seq += 1
            seq = self._seq
            busy = [s for s, p in enumerate(parts) if p is not None]
            undoable = len(busy) > 1
            refs = [self._actors[s].mutate.remote(seq, op, parts[s], undoable) for s in busy]
            results: list[Any] = [None] * len(parts)
            failed: BaseException | None = None
            done = []
            for s, ref in zip(busy, refs, strict=True):
                try:
                    results[s] = self._ray.get(ref)
                    done.append(s)
                except self._ray.exceptions.RayTaskError as e:
                    failed = failed or _cause(e)
            if failed is not None:
                if done:
                    self._seq += 1
                    undo = self._seq
                    self._get(
                        [self._actors[s].mutate.remote(undo, "undo", seq, False) for s in done]
                    )
                raise failed
            return results

    # -- mutations ----------------------------------------------------------

    def add(self, vectors: Any, ids: Any = None) -> np.ndarray:
        """Adds rows under ``ids`` (default: the ids after the largest of the
        whole set) and returns their ids, as :meth:`topk.Index.add`."""
        self._live()
        rows = _rows(vectors, self._backend)
        probe = Index(self._dim, self._metric, "cpu")
        if ids is None:
            top = self._max_id()
            if top >= 0:
                probe.add(np.zeros((1, self._dim), np.float32), ids=[top])
            assigned = probe.add(rows)
        else:
            assigned = probe.add(rows, ids=ids)
        del probe
        assigned = np.ascontiguousarray(assigned, dtype=np.int64)
        self._mutate("add", self._parts(rows, assigned))
        return assigned

    def upsert(self, vectors: Any, ids: Any) -> None:
        """Replaces the vectors of present ids and adds the others, as
        :meth:`topk.Index.upsert`."""
        self._live()
        rows = _rows(vectors, self._backend)
        ids = _inputs.ids_int64(ids, "ids")
        Index(self._dim, self._metric, "cpu").upsert(rows, ids)
        self._mutate("upsert", self._parts(rows, ids))

    def remove(self, ids: Any) -> int:
        """Removes the rows of ``ids``; returns how many were present (absent
        and negative ids are ignored)."""
        self._live()
        ids = _inputs.ids_int64(ids, "ids")
        ids = ids[ids >= 0]
        parts: list[Any] = [None] * len(self._actors)
        for s, sel in enumerate(self._route(ids)):
            if sel.size:
                parts[s] = ids[sel]
        return int(sum(r for r in self._mutate("remove", parts) if r is not None))

    def _parts(self, rows: np.ndarray, ids: np.ndarray) -> list[Any]:
        parts: list[Any] = [None] * len(self._actors)
        for s, sel in enumerate(self._route(ids)):
            if sel.size == ids.size:
                parts[s] = (rows, ids)
            elif sel.size:
                parts[s] = (rows[sel], ids[sel])
        return parts

    def compact(self) -> None:
        """Drops removed rows now on every shard (changes no result)."""
        self._live()
        self._get([a.compact.remote() for a in self._actors])

    # -- reads --------------------------------------------------------------

    def search(self, queries: Any, k: int, filter: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best rows of each query over every shard, as
        :meth:`topk.Index.search` returns them (shapes, padding, the L2
        convention, filters shared or per query)."""
        self._live()
        if not (
            isinstance(queries, np.ndarray)
            and queries.dtype == np.float32
            and queries.flags.c_contiguous
        ):
            queries = _inputs.host_float32(queries, "queries", self._backend)
        if not isinstance(k, int | np.integer):
            raise TypeError(f"k must be an integer, got {type(k).__name__}")
        if k < 1:
            raise InvalidInputError(f"k must be at least 1, got k = {k}")
        k = int(k)
        nq = 1 if queries.ndim == 1 else queries.shape[0]
        filters = self._split_filter(filter, nq)
        q = self._ray.put(queries) if queries.nbytes > _PUT_BYTES else queries
        refs = [a.search.remote(q, k, f) for a, f in zip(self._actors, filters, strict=True)]
        return merge(self._get(refs), k, self._metric)

    def _split_filter(self, filter: Any, nq: int) -> list[Any]:
        """Each shard's share of ``filter``: the allowed ids it holds."""
        n = len(self._actors)
        if filter is None:
            return [None] * n
        if isinstance(filter, np.ndarray) and filter.ndim == 1 and filter.dtype == np.int64:
            how, value = "shared", filter
        else:
            how, value = _inputs.filter_spec(filter, nq)
        if how == "shared":
            return self._split_ids(value)
        per_query = [self._split_ids(f) for f in value]
        return [[per_query[q][s] for q in range(nq)] for s in range(n)]

    def _split_ids(self, ids: np.ndarray) -> list[np.ndarray]:
        ids = ids[ids >= 0]
        return [ids[sel] for sel in self._route(ids)]

    def _max_id(self) -> int:
        return max(self._get([a.max_id.remote() for a in self._actors]))

    def ids(self) -> np.ndarray:
        """The live ids of every shard, ascending, as int64."""
        self._live()
        parts = self._get([a.ids.remote() for a in self._actors])
        return np.sort(np.concatenate(parts)).astype(np.int64, copy=False)

    def _owner(self, id: Any) -> Any | None:
        if not isinstance(id, int | np.integer):
            raise TypeError(f"an id must be an integer, got {type(id).__name__}")
        id = int(id)
        if id < 0 or id > MAX_ID:
            return None
        return self._actors[int(shard_of(np.array([id], np.int64), len(self._actors))[0])]

    def get(self, id: int) -> np.ndarray | None:
        """A copy of the vector stored under ``id``, or None."""
        self._live()
        actor = self._owner(id)
        return None if actor is None else self._get([actor.get.remote(int(id))])[0]

    def __contains__(self, id: object) -> bool:
        self._live()
        actor = self._owner(id)
        return actor is not None and bool(self._get([actor.contains.remote(int(id))])[0])

    def __len__(self) -> int:
        self._live()
        return int(sum(self._get([a.size.remote() for a in self._actors])))

    @property
    def dim(self) -> int:
        """Values per row."""
        return self._dim

    @property
    def metric(self) -> str:
        """``"cosine"``, ``"dot"`` or ``"l2"``."""
        return self._metric

    @property
    def backend(self) -> str:
        """The backend the shards search on."""
        return self._backend

    @property
    def shards(self) -> int:
        """How many shards."""
        return len(self._actors)

    @property
    def actors(self) -> list[Any]:
        """The shards' Ray actor handles, in placement order."""
        return list(self._actors)

    @property
    def path(self) -> Path:
        """The set's folder (its logs; where :meth:`save` writes by default)."""
        return self._path

    # -- files --------------------------------------------------------------

    def save(self, path: str | os.PathLike[str] | None = None) -> None:
        """Saves the set into the folder ``path`` (default: the set's own):
        one ``topk.Index`` file per shard, then ``manifest.json`` replaced
        atomically, then the files of older saves deleted; the layout the
        Rust ``ShardedIndex`` reads. A save into the set's own folder also
        makes the new files the shards' restart point (their logs restart)."""
        with self._lock:
            self._live()
            target = self._path if path is None else Path(path).absolute()
            try:
                target.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise IndexFileError(f"could not create the folder {target}: {e}") from None
            try:
                generation = int(_read_manifest(target)["generation"]) + 1
            except IndexFileError:
                generation = 1
            rebase = target.resolve() == self._path.resolve()
            files = [_shard_file_name(generation, s) for s in range(len(self._actors))]
            saved = self._get(
                [
                    a.save.remote(str(target / f), rebase)
                    for a, f in zip(self._actors, files, strict=True)
                ]
            )
            manifest = {
                "dim": self._dim,
                "metric": self._metric,
                "generation": generation,
                "shards": [
                    {"file": f, "rows": int(rows), "backend": str(backend)}
                    for f, (rows, backend) in zip(files, saved, strict=True)
                ],
            }
            _write_manifest(target, manifest)
            _remove_stale(target, manifest)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        backend: str | None = None,
        *,
        num_gpus: float = 0,
        num_cpus: float | None = None,
    ) -> ShardedIndex:
        """Opens the set saved in the folder ``path`` (by this class or by the
        Rust ``ShardedIndex``), one actor per shard of its manifest, each
        opening its file as :meth:`topk.Index.open` does with ``backend``.
        The folder becomes the set's own. A shard file that disagrees with
        the manifest (rows, D, metric, an id on the wrong shard) is an
        :class:`~topk.IndexFileError`."""
        folder = Path(path).absolute()
        manifest = _read_manifest(folder)
        if backend is not None:
            probe_backend = "cpu" if backend.lower() == "cuda" else backend
            Index(1, "dot", probe_backend)
        inits = [
            {
                "file": str(folder / entry["file"]),
                "rows": int(entry["rows"]),
                "dim": int(manifest["dim"]),
                "metric": str(manifest["metric"]),
                "backend": backend,
                "options": {},
            }
            for entry in manifest["shards"]
        ]
        self = cls.__new__(cls)
        self._start(folder, False, inits, num_gpus, num_cpus)
        return self

    # -- life ---------------------------------------------------------------

    def close(self) -> None:
        """Stops the actors and deletes the logs (and the folder when it is a
        temporary one). Saved files stay. Closing twice does nothing."""
        if getattr(self, "_closed", True):
            return
        with self._lock:
            self._shutdown()

    def _shutdown(self) -> None:
        self._closed = True
        with contextlib.suppress(self._ray.exceptions.RayError):
            self._ray.get([a.close.remote() for a in self._actors])
        for a in self._actors:
            self._ray.kill(a, no_restart=True)
        if self._owned:
            shutil.rmtree(self._path, ignore_errors=True)
        else:
            # Left when another set's logs share the folder.
            with contextlib.suppress(OSError):
                (self._path / _LOG_FOLDER).rmdir()

    def __enter__(self) -> ShardedIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"len={len(self)}"
        return (
            f"topk.ray.ShardedIndex(dim={self._dim}, metric={self._metric!r}, "
            f"backend={self._backend!r}, shards={len(self._actors)}, {state})"
        )
