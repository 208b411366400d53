"""Type stubs of the compiled extension ``topk._topk`` (re-exported by ``topk``)."""

from collections.abc import Sequence
from os import PathLike
from typing import Any, Literal, final

import numpy as np
import numpy.typing as npt

MAX_ID: int
"""The largest id an index holds: 2^63 - 1."""
PLACEMENT: str
"""The name of the placement rule of :func:`shard_of` (recorded in every set manifest)."""
MANIFEST_FILE: str
"""The manifest's file name inside a saved set's folder: ``manifest.json``."""

_Ids = npt.ArrayLike
_Filter = npt.ArrayLike | Sequence[npt.ArrayLike] | None

def merge(
    results: Sequence[tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]],
    k: int,
    metric: Literal["cosine", "dot", "l2"] | str,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """The best ``k`` of several shards' results of the same queries.

    ``results`` holds one ``(scores, ids)`` pair per shard, as numpy arrays
    in the layout :meth:`Index.search` returns them (all 1-D for one query, or all 2-D with
    the same number of rows; their widths may differ), from indexes holding
    distinct ids under ``metric``. Returns ``(scores, ids)`` in the same shape
    and convention (``-1`` / ``-inf`` padding, squared distances for
    ``"l2"``), best first, ties by the smaller id: the bytes one index over
    the union returns. Hits are copied, never rescored (the Rust
    ``merge_hits``). A mismatched shape, ``k < 1``, a NaN score, a negative id
    other than ``-1``, or an id twice among the inputs (in two shards' results
    or twice in one) is an :class:`~topk.InvalidInputError`."""

def shard_of(ids: _Ids, shards: int) -> npt.NDArray[np.int64]:
    """The shard of each id among ``shards`` (the placement rule
    :data:`PLACEMENT`: the SplitMix64 finaliser of the id, then
    ``(h * shards) >> 64``). Ids must be in ``0..=MAX_ID`` and ``shards`` at
    least 1 (an :class:`~topk.InvalidInputError` otherwise)."""

def _read_manifest(path: str | PathLike[str]) -> dict[str, Any]:
    """The checked manifest of the set in the folder ``path`` as a dict
    (``format``, ``version``, ``placement``, ``dim``, ``metric``,
    ``generation``, ``shards``: a list of ``{file, rows, backend}``); a
    missing or bad one is an :class:`~topk.IndexFileError`."""

def _write_manifest(path: str | PathLike[str], manifest: dict[str, Any]) -> bool:
    """Writes ``manifest`` (``dim``, ``metric``, ``generation``, ``shards``)
    into the folder ``path`` atomically; returns whether the folder was
    synced after the rename (only then may older files be deleted)."""

def _remove_stale(path: str | PathLike[str], manifest: dict[str, Any]) -> int:
    """Deletes the shard files in ``path`` that ``manifest`` does not name;
    returns how many."""

def _shard_file_name(generation: int, shard: int) -> str:
    """The file name of shard ``shard`` in save generation ``generation``."""

def _next_generation(path: str | PathLike[str]) -> int:
    """The generation the next save into the folder ``path`` writes: one past
    the larger of its manifest's and of every shard file's there."""

@final
class _SaveLock:
    """The save lock of a set's folder (the one the Rust ``ShardedIndex``
    takes): ``with _SaveLock(folder):`` waits for it and holds it."""

    def __init__(self, folder: str | PathLike[str]) -> None: ...
    def __enter__(self) -> _SaveLock: ...
    def __exit__(self, kind: object, value: object, traceback: object) -> bool: ...

def backends() -> dict[str, bool | str]:
    """Every backend an :class:`Index` accepts: ``True`` when it can run on
    this machine, otherwise the reason it cannot (e.g. no NVIDIA driver)."""

@final
class Index:
    """An exact top-K index whose rows carry int64 ids (docs/CONTRACTS.md §10).

    ``Index(dim, metric="cosine", backend="cpu", dtype=None, **options)``.

    * ``metric``: ``"cosine"``, ``"dot"`` or ``"l2"``.
    * ``backend``: a name from :func:`backends` (``"cpu"``, ``"oracle"``, ...).
      The exact backends return the same bytes (ids and score bits).
    * ``dtype``: how rows are stored (docs/CONTRACTS.md §14): ``None`` (the
      default) or ``"float32"``, ``"float16"`` or ``"bfloat16"`` (also ``np.float16``, ``"f16"``,
      ``"bf16"``). Half-width rows take half the bytes; each value is rounded
      once, to nearest even, as it is added, and searches are exact over the
      stored values. A value beyond float16's range (65504) is an error
      naming it. Queries stay float32; ``save`` keeps the type.
    * ``options``: ``capacity`` (rows to reserve); for ``hnsw``: ``m``,
      ``ef_construction``, ``ef`` (alias ``ef_search``), ``seed``,
      ``parallel``; for ``cuda``: ``device``, ``max_k``, ``max_batch``,
      ``streams``. A backend ignores the options of the others (the
      ``hnsw`` values are still checked, an out-of-range one is an
      :class:`~topk.InvalidInputError`); an unknown name is a ``TypeError``.

    **Inputs.** A float32 C-contiguous numpy array is read in place; other
    float dtypes, non-contiguous arrays, lists, CPU torch tensors and objects
    with ``__array__`` / ``__dlpack__`` are converted with one copy (a CPU
    float32 contiguous torch tensor is shared, not copied). A non-float dtype
    is a ``TypeError`` naming it. A CUDA tensor given to a host backend is an
    :class:`~topk.InvalidInputError` saying so.

    **Results.** ``search`` returns ``(scores, ids)``: float32 and int64 of
    shape ``(Q, k)`` for 2-D queries, ``(k,)`` for one 1-D query, best first;
    equal scores rank by the smaller id. When fewer than ``k`` rows qualify
    the rest is ``-1`` ids with ``-inf`` scores. For ``metric="l2"`` the
    scores are **squared L2 distances**, ascending (as FAISS's ``IndexFlatL2``
    returns), padded with ``+inf``; the Rust side's score is their negation,
    so the two carry the same bits up to the sign.

    **Threads.** Every method that does work releases the GIL; searches run
    concurrently, mutations one at a time. An array passed in must not be
    written by another thread during the call that reads it.
    """

    def __init__(
        self,
        dim: int,
        metric: Literal["cosine", "dot", "l2"] | str = "cosine",
        backend: str = "cpu",
        dtype: str | np.dtype[Any] | type[np.floating[Any]] | None = None,
        **options: int | bool,
    ) -> None: ...
    @staticmethod
    def open(path: str | PathLike[str], backend: str | None = None) -> Index:
        """Opens a file written by :meth:`save` (every check runs before the
        index exists; a bad file is an :class:`~topk.IndexFileError` naming
        the offset). ``backend=None`` opens a file holding an ``hnsw`` graph on
        ``"hnsw"`` and any other on ``"cpu"``."""
    def add(self, vectors: npt.ArrayLike, ids: _Ids | None = None) -> npt.NDArray[np.int64]:
        """Adds ``(n, dim)`` rows (a 1-D array is one row) under ``ids``, or
        by default under the ids after the largest present (0, 1, ... when
        empty); returns the ids. All or nothing: an id present, repeated,
        negative, a wrong width or NaN/Inf is an error that changes nothing."""
    def upsert(self, vectors: npt.ArrayLike, ids: _Ids) -> None:
        """Replaces the vectors of present ids and adds the others (all or nothing)."""
    def remove(self, ids: _Ids) -> int:
        """Removes the rows of ``ids``; returns how many were present (absent
        and negative ids are ignored)."""
    def _search_device(
        self, ptr: int, nq: int, k: int, filter: _Filter, stream: int
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """Queries in GPU memory at device address ``ptr`` (``nq`` rows of
        ``dim`` float32), read after the work on CUDA stream ``stream``; used
        by :func:`topk._inputs._search_cuda_tensor`."""
    def _time_rust_search(self, query: npt.ArrayLike, k: int, repeats: int) -> list[int]:
        """Nanoseconds of each of ``repeats`` Rust ``Index::search`` calls for
        one query (the baseline of ``bench/python_overhead.py``)."""
    def _time_rust_search_device(
        self, ptr: int, nq: int, k: int, stream: int, repeats: int
    ) -> list[int]:
        """Nanoseconds of each of ``repeats`` Rust ``Index::search_device`` calls."""
    def search(
        self, queries: npt.ArrayLike, k: int, filter: _Filter = None
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """The ``k`` best rows of each query (see the class documentation for
        shapes, padding and the L2 convention). ``filter`` is an int64 array
        of allowed ids shared by the batch, or a list of one such array per
        query; ids the index does not hold (and negative ones) are ignored.
        On a ``cuda`` index a CUDA query tensor returns tensors on its device
        (torch for torch, CuPy for CuPy) instead of numpy arrays."""
    def save(self, path: str | PathLike[str]) -> None:
        """Writes the index to ``path`` atomically (a temporary file renamed
        over it), checksummed."""
    def compact(self) -> None:
        """Drops removed rows now (removals compact by themselves past a quarter)."""
    def prepare_certified(self) -> None:
        """Builds the ``cpu`` backend's certified-path state now (int8 codes,
        a quarter of the bytes of float32 rows), so that single queries over
        2**20 stored values take the fast exact path from the first one. The
        first batch of 16 or more queries builds it anyway; every change of
        the rows keeps it up to date. Results are the same bytes either way."""
    @property
    def certified_coverage(self) -> int | None:
        """Stored rows the certified-path state covers; ``None`` before it is
        built."""
    def ids(self) -> npt.NDArray[np.int64]:
        """The live ids, ascending."""
    def get(self, id: int) -> npt.NDArray[np.float32] | None:
        """A copy of the vector stored under ``id``, or ``None`` (also for a
        negative int or one past 2**63 - 1); a value that is no int is a
        ``TypeError``."""
    def __contains__(self, id: int) -> bool:
        """Whether ``id`` is a live id; a negative int or one past 2**63 - 1
        is not one (``False``), a value that is no int a ``TypeError``."""
    def __len__(self) -> int: ...
    @property
    def dim(self) -> int:
        """Values per row."""
    @property
    def metric(self) -> str:
        """``"cosine"``, ``"dot"`` or ``"l2"``."""
    @property
    def backend(self) -> str:
        """The backend searches run on."""
    @property
    def dtype(self) -> str:
        """How the rows are stored: ``"float32"``, ``"float16"`` or ``"bfloat16"``."""
    @property
    def nbytes(self) -> int:
        """Bytes the stored rows take."""
