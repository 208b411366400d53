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
write-ahead log of every mutation since (one record per mutation, appended
and fsynced before the call returns; a CRC-32 of the record's header and
one of its payload). A torn last record (a crash mid-write) is dropped; any
other bad record stops the restart with an :class:`~topk.IndexFileError`
naming its offset, and the log is left as it is. A mutation whose record
the log cannot take (a full disk) is undone in its shard and raised as an
:class:`~topk.IndexFileError`, so the shard never holds what its log lacks.
A restarted actor reopens its file and replays its log;
every mutation carries the driver's sequence number, so one retried after a
restart is applied once. The folder must be reachable at the same path from
every node that runs a shard (a shared file system) when Ray spans machines.

``import topk.ray`` does not import Ray; the first :class:`ShardedIndex`
does, and says ``pip install ray`` when it is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import _inputs
from ._ray_shard import _LOG_FOLDER, _PUT_BYTES, _actor, _cause, _ray
from ._topk import (
    MANIFEST_FILE,
    MAX_ID,
    Index,
    _next_generation,
    _read_manifest,
    _remove_stale,
    _SaveLock,
    _shard_file_name,
    _write_manifest,
    merge,
    shard_of,
)
from .errors import IndexFileError, InvalidInputError

__all__ = ["ShardedIndex"]


def _rows(vectors: Any, backend: str) -> np.ndarray:
    """``vectors`` as a float32 C-contiguous ``(n, D)`` array (1-D: one row)."""
    rows = _inputs.host_float32(vectors, "vectors", backend)
    return rows.reshape(1, -1) if rows.ndim == 1 else rows


def _capacity(value: Any) -> int:
    """The ``capacity`` option checked as ``topk.Index`` checks it."""
    if isinstance(value, bool):
        raise TypeError(f"option capacity must be an integer, got a bool ({value})")
    if not isinstance(value, int | np.integer):
        raise TypeError(
            f"option capacity must be an integer, got {value!r} ({type(value).__name__})"
        )
    if value < 0:
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
        # Reentrant: an add holds it from choosing its ids to applying them.
        self._lock = threading.RLock()
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
        # Shards of one set store one type (docs/CONTRACTS.md §12, §14); the
        # driver's checks of a mutation use it too.
        self._dtype = str(infos[0][4])
        mixed = [i for i, info in enumerate(infos) if str(info[4]) != self._dtype]
        if mixed:
            self._shutdown()
            raise IndexFileError(
                f"shard {mixed[0]} stores {infos[mixed[0]][4]} rows, shard 0 stores {self._dtype}"
            )

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
        probe = Index(self._dim, self._metric, "cpu", dtype=self._dtype)
        # Ids chosen and applied under one hold of the lock: two concurrent
        # adds never pick the same ids.
        with self._lock:
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
        Index(self._dim, self._metric, "cpu", dtype=self._dtype).upsert(rows, ids)
        self._mutate("upsert", self._parts(rows, ids))

    def remove(self, ids: Any) -> int:
        """Removes the rows of ``ids``; returns how many were present (absent
        and negative ids are ignored)."""
        self._live()
        ids = _inputs.ids_int64(ids, "ids", lookup=True)
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
        if queries.ndim not in (1, 2):
            raise InvalidInputError(
                "queries must be one vector (1-D) or a 2-D array of rows, "
                f"got shape {queries.shape}"
            )
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
    def dtype(self) -> str:
        """How the shards store their rows: ``"float32"``, ``"float16"`` or
        ``"bfloat16"`` (the ``dtype=`` option, kept by ``save``)."""
        return self._dtype

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
        Rust ``ShardedIndex`` reads, under the same folder lock. A failure
        leaves the previous save whole and deletes this one's files. A save
        into the set's own folder also makes the new files the shards'
        restart point (their logs restart)."""
        with self._lock:
            self._live()
            target = self._path if path is None else Path(path).absolute()
            try:
                target.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise IndexFileError(f"could not create the folder {target}: {e}") from None
            with _SaveLock(target):
                self._save_locked(target)

    def _save_locked(self, target: Path) -> None:
        generation = _next_generation(target)
        files = [_shard_file_name(generation, s) for s in range(len(self._actors))]
        try:
            saved = self._get(
                [a.save.remote(str(target / f)) for a, f in zip(self._actors, files, strict=True)]
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
            synced = _write_manifest(target, manifest)
        except BaseException:
            # No manifest names them: this save's files go (a full disk
            # gets its room back for the next try).
            for f in files:
                with contextlib.suppress(OSError):
                    (target / f).unlink()
            raise
        rebased = True
        if target.resolve() == self._path.resolve():
            # Only now that the manifest names the new files do the shards
            # restart from them; a shard whose restart point could not move
            # keeps its old file and log, so no older file may go yet.
            refs = [
                a.rebase.remote(str(target / f)) for a, f in zip(self._actors, files, strict=True)
            ]
            try:
                self._get(refs)
            except Exception as e:  # the save itself stands
                rebased = False
                warnings.warn(
                    f"the set was saved in {target}, but a shard kept its older restart "
                    f"point ({e}); the older files stay until the next save",
                    RuntimeWarning,
                    stacklevel=3,
                )
            # A set saved in its own temporary folder keeps the folder:
            # closing deletes the logs only, never saved files.
            self._owned = False
        # Older files go only once the new manifest is surely on disk.
        if synced and rebased:
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
        if backend is not None and not isinstance(backend, str):
            raise TypeError(f"backend must be a str or None, got {type(backend).__name__}")
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
        temporary one that no :meth:`save` wrote to). Saved files stay.
        Closing twice does nothing."""
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
