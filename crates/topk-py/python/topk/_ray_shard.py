"""The shard actor of :mod:`topk.ray`: one ``topk.Index``, its write-ahead
log and its restart from the set's folder (see :mod:`topk.ray` for the rules).
"""

from __future__ import annotations

import os
import pickle
import struct
import threading
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ._topk import (
    Index,
    shard_of,
)
from .errors import IndexFileError, InvalidInputError

_LOG_FOLDER = ".topk-ray-logs"
# Each log record: payload length, CRC-32 of the payload, CRC-32 of those
# eight bytes, then the payload. The header's own check tells a corrupt
# length (refused) from a record cut short by a crash (dropped).
_RECORD = struct.Struct("<III")
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
    """The records of the log at ``path``. A torn last record (a crash while
    it was written: a short header, a payload running past the end, a last
    payload failing its check, or a zero-filled tail) is cut off the file.
    Any other bad record is an :class:`IndexFileError` naming its offset, and
    the file is left as it is."""
    data = path.read_bytes()
    records: list[Any] = []
    offset = 0
    while offset < len(data):
        end = offset + _RECORD.size
        if end > len(data):
            break
        length, crc, header_crc = _RECORD.unpack_from(data, offset)
        if zlib.crc32(data[offset : offset + 8]) != header_crc:
            # Scanned only here, not per record: zeros to the end are the
            # tail a crash left, anything else a corrupt header.
            if not any(data[offset:]):
                break
            raise IndexFileError(
                f"{path}: the log record header at byte {offset} fails its CRC-32 check"
            )
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
    head = struct.pack("<II", len(payload), zlib.crc32(payload))
    return head + struct.pack("<I", zlib.crc32(head)) + payload


def _append(fd: int, data: bytes) -> None:
    """Writes all of ``data`` at the end of the log ``fd`` and syncs it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


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
        self._log: int | None = None
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
            self._log = self._open_log()
        except Exception as e:
            # Ray reports a constructor's exception as the actor's death, not
            # as the exception itself: kept and raised by every later call,
            # the driver sees topk's own error class and message.
            self._error = e

    def _open_log(self) -> int:
        """The log's file descriptor, for appending (held for the actor's life)."""
        return os.open(self._log_path, os.O_WRONLY | os.O_APPEND)

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
        record = _encode(("mut", seq, op, args))
        # The inverse is taken whatever `undoable` says: a log that cannot
        # take the record (a full disk) undoes the mutation here.
        result, inverse = self._apply(op, args, True)
        size = os.fstat(self._log).st_size
        try:
            _append(self._log, record)
        except OSError as e:
            self._unlog(size, inverse, e)
            raise IndexFileError(
                f"{self._log_path}: the write-ahead log could not take mutation {seq} "
                f"({op}): {e}; the shard is as it was before the call"
            ) from e
        self._record(seq, result, inverse if undoable else None)
        return result

    def _unlog(self, size: int, inverse: tuple[str, Any] | None, cause: OSError) -> None:
        """Puts the log back to ``size`` bytes and the index back as it was,
        after an append failed; a failure here leaves the shard refusing
        every call (a restart replays the log as it is on disk)."""
        try:
            os.ftruncate(self._log, size)
            os.fsync(self._log)
            if inverse is None:
                raise InvalidInputError("an undo cannot itself be undone")
            self._apply(*inverse, False)
        except Exception as e:
            self._error = IndexFileError(
                f"{self._log_path}: a mutation that the log could not take ({cause}) could "
                f"not be undone ({e}); the shard refuses calls until its actor restarts"
            )
            raise self._error from e

    def search(self, queries: np.ndarray, k: int, filter: Any) -> Any:
        """The shard's ``Index.search``."""
        self._check()
        return self._index.search(queries, k, filter)

    def info(self) -> tuple[int, str, str, int, str]:
        """``(dim, metric, backend, len, dtype)``."""
        self._check()
        i = self._index
        return i.dim, i.metric, i.backend, len(i), i.dtype

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

    def save(self, file: str) -> tuple[int, str]:
        """Saves the shard to ``file``. Returns ``(rows, backend)``."""
        self._check()
        self._index.save(file)
        return len(self._index), self._index.backend

    def rebase(self, file: str) -> None:
        """Makes ``file`` (this shard's rows, just saved and named by the
        set's manifest) the shard's restart point: its log starts again.
        When the new log cannot be written the old one stays in use."""
        self._check()
        base = {**self._init, "file": file, "backend": self._index.backend, "rows": None}
        os.close(self._log)
        try:
            self._write_base(base)
            self._init = base
        finally:
            # The new log, or the old one when the new base failed.
            self._log = self._open_log()

    def close(self) -> None:
        """Deletes the log (the set is closed for good)."""
        if self._log is not None:
            os.close(self._log)
            self._log = None
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
