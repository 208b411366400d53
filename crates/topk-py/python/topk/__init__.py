"""topk: exact top-K vector retrieval.

numpy arrays (and torch tensors) in, ``(scores, ids)`` out, the same bytes
on every exact backend::

    import numpy as np
    import topk

    idx = topk.Index(384, metric="cosine")          # backend="cpu" | "oracle" | ...
    ids = idx.add(np.random.rand(1000, 384).astype(np.float32))
    queries = np.random.rand(5, 384).astype(np.float32)
    scores, ids = idx.search(queries, k=10)          # (5, 10) float32 and int64
    idx.save("docs.topkidx")
    idx2 = topk.Index.open("docs.topkidx")

See :class:`Index` for the rules (ids, padding, the L2 convention, filters,
threads) and :mod:`topk.errors` for the exceptions. :func:`shard_of` and
:func:`merge` are the placement rule and the merge of a sharded index;
:mod:`topk.ray` spreads one over Ray actors.
"""

from __future__ import annotations

from . import errors
from ._inputs import copy_count
from ._topk import MAX_ID, PLACEMENT, Index, backends, merge, shard_of
from .errors import DeviceError, IndexFileError, InvalidInputError, TopkError

__all__ = [
    "MAX_ID",
    "PLACEMENT",
    "DeviceError",
    "Index",
    "IndexFileError",
    "InvalidInputError",
    "TopkError",
    "backends",
    "copy_count",
    "errors",
    "merge",
    "shard_of",
]
