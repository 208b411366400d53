"""Turning what callers pass into what the extension reads.

The extension (``topk._topk``) reads float32 C-contiguous numpy arrays and
int64 numpy id arrays in place. Everything else comes here first: it is
converted once (and counted in :func:`copy_count`), refused with a
``TypeError`` naming its dtype, or, for a CUDA tensor, routed to
:func:`_search_cuda_tensor`.
"""

from __future__ import annotations

import operator
import threading
from typing import Any

import numpy as np

from .errors import InvalidInputError

_MAX_ID = 2**63 - 1

_lock = threading.Lock()
_copies = 0


def copy_count() -> int:
    """How many inputs were converted with a copy since the process started.

    A float32 C-contiguous numpy array (or a CPU torch tensor of that layout)
    never adds to it; any other float dtype or layout adds one per call.
    """
    return _copies


def _counted_copy() -> None:
    global _copies
    with _lock:
        _copies += 1


def _torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "is_cuda")


def _not_float(name: str, dtype: Any) -> TypeError:
    """The error of an input whose values are not floating-point."""
    return TypeError(
        f"{name} must hold floating-point values (float32 is read in place), got dtype {dtype}"
    )


def cuda_device(obj: Any) -> Any | None:
    """The device of a CUDA tensor (torch, CuPy, anything with
    ``__cuda_array_interface__``), or ``None`` for host data."""
    if _torch_tensor(obj):
        return obj.device if obj.is_cuda else None
    if hasattr(obj, "__cuda_array_interface__"):
        return getattr(obj, "device", "cuda")
    return None


def host_float32(obj: Any, name: str, backend: str) -> np.ndarray:
    """``obj`` as a float32 C-contiguous numpy array, with at most one copy."""
    device = cuda_device(obj)
    copied = isinstance(obj, list | tuple)
    if device is not None:
        if backend != "cuda":
            raise InvalidInputError(
                f"{name} is a CUDA tensor (on {device}) but this index's backend is "
                f"{backend!r}, which searches host memory: move it with .cpu(), "
                f"or use a 'cuda' index"
            )
        obj = _cuda_to_host(obj)
        copied = True
    if _torch_tensor(obj):
        tensor = obj.detach()
        if not tensor.dtype.is_floating_point:
            raise _not_float(name, tensor.dtype)
        if str(tensor.dtype) == "torch.bfloat16":
            # numpy has no bfloat16: widen on the torch side (the one copy).
            tensor = tensor.float()
            copied = True
        # A CPU tensor shares its memory with the array (no copy).
        arr = tensor.numpy()
    elif isinstance(obj, np.ndarray):
        arr = obj
    elif hasattr(obj, "__array__"):
        arr = np.asarray(obj)
    elif hasattr(obj, "__dlpack__"):
        arr = np.from_dlpack(obj)
    else:
        arr = np.asarray(obj)
    if arr.dtype.kind != "f":
        raise _not_float(name, arr.dtype)
    if arr.ndim not in (1, 2):
        raise InvalidInputError(
            f"{name} must be one vector (1-D) or a 2-D array of rows, got shape {arr.shape}"
        )
    # C order and aligned (a view at an odd byte offset is copied too).
    out = np.require(arr, dtype=np.float32, requirements=["C", "A"])
    if out is not arr or copied:
        _counted_copy()
    return out


def _cuda_to_host(obj: Any) -> Any:
    """A CUDA array copied to the host: a CPU torch tensor for torch, a numpy
    array for CuPy (``.get()``) and for any other ``__cuda_array_interface__``
    object (through torch)."""
    if _torch_tensor(obj):
        return obj.detach().cpu()
    if type(obj).__module__.startswith("cupy"):
        return obj.get()
    import torch

    return torch.as_tensor(obj, device="cuda").cpu()


def ids_int64(obj: Any, name: str, lookup: bool = False) -> np.ndarray:
    """``obj`` (an integer array, list or scalar, on the host or a CUDA
    device) as a 1-D int64 C-contiguous numpy array. An id above 2^63 - 1
    is refused, naming it and its position; with ``lookup`` (ids to find,
    as ``remove`` and ``filter`` take them, not to store) it is dropped
    instead, as no index can hold it."""
    if cuda_device(obj) is not None:
        obj = _cuda_to_host(obj)
    if _torch_tensor(obj):
        obj = obj.detach().numpy()
    arr = np.asarray(obj)
    if arr.dtype == object:
        if arr.ndim > 1:
            raise InvalidInputError(f"{name} must be one-dimensional, got shape {arr.shape}")
        values = []
        for pos, v in enumerate(arr.ravel()):
            try:
                # operator.index, not int(): 1.9, Decimal("12.7") or "7" is
                # refused, never rounded to an id.
                i = operator.index(v)
            except TypeError:
                raise TypeError(
                    f"{name}[{pos}] = {v!r} is not an integer ({type(v).__name__})"
                ) from None
            if i > _MAX_ID or i < -(2**63):
                if lookup:
                    continue
                raise InvalidInputError(
                    f"{name}: id {i} at position {pos} is outside the ids 0..=2^63 - 1"
                )
            values.append(i)
        arr = np.asarray(values, dtype=np.int64)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise InvalidInputError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and arr.size == 0):
        raise TypeError(
            f"{name} must hold integers (int64 is read in place), got dtype {arr.dtype}"
        )
    if arr.dtype.kind == "u" and arr.size and arr.max() > _MAX_ID:
        if lookup:
            arr = arr[arr <= _MAX_ID]
        else:
            pos = int(np.argmax(arr > _MAX_ID))
            raise InvalidInputError(
                f"id {int(arr[pos])} at position {pos} is above the largest id {_MAX_ID} (2^63 - 1)"
            )
    return np.require(arr, dtype=np.int64, requirements=["C", "A"])


def filter_spec(obj: Any, queries: int) -> tuple[str, Any]:
    """A search ``filter`` as ``("shared", ids)`` or ``("per_query", [ids, ...])``.

    A 1-D integer array (or list of ints) is shared by the whole batch; a
    list or tuple whose items are themselves arrays or lists, or a 2-D
    array, is one filter per query (row ``i`` for query ``i``).
    """
    if isinstance(obj, np.ndarray) and obj.ndim == 2:
        obj = list(obj)
    # An item is a per-query filter when it has an axis: numpy integer
    # scalars (``list(arr)``) have ``__array__`` too, but are ids.
    if isinstance(obj, list | tuple) and any(
        isinstance(f, list | tuple) or (hasattr(f, "__array__") and np.ndim(f) >= 1) for f in obj
    ):
        if len(obj) != queries:
            raise InvalidInputError(
                f"{len(obj)} filters for {queries} queries: give one filter per query"
            )
        return "per_query", [ids_int64(f, f"filter[{i}]", lookup=True) for i, f in enumerate(obj)]
    return "shared", ids_int64(obj, "filter", lookup=True)


def search_other(index: Any, queries: Any, k: int, filter: Any) -> Any:
    """``index.search`` for queries that are not float32 C-contiguous numpy."""
    if cuda_device(queries) is not None and index.backend == "cuda":
        return _search_cuda_tensor(index, queries, k, filter)
    return index.search(host_float32(queries, "queries", index.backend), k, filter)


def _search_cuda_tensor(index: Any, queries: Any, k: int, filter: Any) -> Any:
    """Searches a CUDA query tensor on a ``cuda`` index where it lives.

    The engine reads the queries from the tensor's device memory (no copy
    through the host), after the work queued on the caller's current stream;
    a query tensor that is not float32 and contiguous is converted on its
    device first (one device copy, counted by :func:`topk.copy_count`). The
    ``(scores, ids)`` come back as tensors on the query's device (CuPy arrays
    for a CuPy query), copied there from the host on the current stream:
    ``k`` values per query, the only bytes that cross the bus.
    """
    if type(queries).__module__.startswith("cupy"):
        import cupy

        with queries.device:
            q = queries
            if q.dtype.kind != "f":
                raise _not_float("queries", q.dtype)
            if q.dtype != cupy.float32 or not q.flags.c_contiguous:
                q = cupy.ascontiguousarray(q, dtype=cupy.float32)
                _counted_copy()
            if q.ndim not in (1, 2):
                raise InvalidInputError(
                    f"queries must be 1-D or 2-D, got a CuPy array of shape {tuple(q.shape)}"
                )
            single = q.ndim == 1
            q2 = q.reshape(1, -1) if single else q
            _check_dim(index, q2.shape[1])
            stream = cupy.cuda.get_current_stream().ptr
            scores, ids = index._search_device(q2.data.ptr, q2.shape[0], k, filter, stream)
            scores, ids = cupy.asarray(scores), cupy.asarray(ids)
            return (scores[0], ids[0]) if single else (scores, ids)
    import torch

    tensor = queries if _torch_tensor(queries) else torch.as_tensor(queries, device="cuda")
    tensor = tensor.detach()
    if not tensor.dtype.is_floating_point:
        raise _not_float("queries", tensor.dtype)
    if tensor.dtype != torch.float32 or not tensor.is_contiguous():
        tensor = tensor.to(dtype=torch.float32).contiguous()
        _counted_copy()
    single = tensor.dim() == 1
    q2 = tensor.reshape(1, -1) if single else tensor
    if q2.dim() != 2:
        raise InvalidInputError(
            f"queries must be 1-D or 2-D, got a tensor of shape {tuple(tensor.shape)}"
        )
    _check_dim(index, q2.shape[1])
    device = tensor.device
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        scores, ids = index._search_device(q2.data_ptr(), q2.shape[0], k, filter, stream)
        scores = torch.from_numpy(scores).to(device, non_blocking=False)
        ids = torch.from_numpy(ids).to(device, non_blocking=False)
    return (scores[0], ids[0]) if single else (scores, ids)


def _check_dim(index: Any, dim: int) -> None:
    if dim != index.dim:
        raise InvalidInputError(
            f"dimension mismatch: queries have {dim} values, the index has D = {index.dim}"
        )
