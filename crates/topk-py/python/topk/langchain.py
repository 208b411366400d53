"""A LangChain vector store over :class:`topk.Index`.

``pip install "topk[langchain]"``; this module imports ``langchain_core``
and nothing else of LangChain::

    from langchain_core.embeddings import DeterministicFakeEmbedding
    from topk.langchain import TopkVectorStore

    store = TopkVectorStore.from_texts(["foo", "bar"], DeterministicFakeEmbedding(size=8))
    store.similarity_search("bar", k=1)

Texts and metadata are kept in Python beside the index; LangChain's string
ids map to the index's int64 ids. A metadata ``filter`` (a dict of required
values, or a callable taking a :class:`~langchain_core.documents.Document`)
becomes an id allow-list, so a filtered search is still exact: the ``k``
best documents among those that match.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore
from langchain_core.vectorstores.utils import maximal_marginal_relevance

from ._topk import Index

__all__ = ["TopkVectorStore"]

_Filter = dict[str, Any] | Callable[[Document], bool] | None

# Folders written before the docs file named its index file hold this one.
_INDEX_FILE = "index.topkidx"
_DOCS_FILE = "docs.json"
# The index files save_local writes (and deletes once a newer save names another).
_SAVED_INDEX = re.compile(r"index(-[0-9a-f]{32})?\.topkidx")


class _ReadWriteLock:
    """Many readers (searches, lookups) at once, or one writer (an add, a
    delete, a save); a waiting writer goes before readers that come after
    it. Not reentrant."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def read(self) -> Any:
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Any:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class TopkVectorStore(VectorStore):
    """A ``VectorStore`` whose vectors live in a :class:`topk.Index`.

    ``metric``, ``backend`` and ``**index_options`` are those of
    :class:`topk.Index`; the index is created at the first add (its
    dimension is the embeddings'). Scores of ``similarity_search_with_score``
    are the index's: cosine similarity, dot product, or squared L2 distance.
    """

    def __init__(
        self,
        embedding: Embeddings,
        *,
        metric: str = "cosine",
        backend: str = "cpu",
        index: Index | None = None,
        **index_options: Any,
    ) -> None:
        if index is not None and len(index) > 0:
            # Its rows would have no documents (and their ids would clash
            # with the store's): a saved store comes back by load_local.
            raise ValueError(
                f"index holds {len(index)} rows without documents: give an empty index, "
                "or use TopkVectorStore.load_local"
            )
        self._embedding = embedding
        # Threads (LangChain's async methods run on executor threads): adds,
        # deletes and saves one at a time, searches beside each other but
        # never beside a change, so a search sees each document whole.
        self._lock = _ReadWriteLock()
        # The index's own name of the metric ("L2", "euclidean" -> "l2"),
        # which the relevance function below compares.
        self._metric = index.metric if index is not None else Index(1, metric=metric).metric
        self._backend = index.backend if index is not None else backend
        self._options = index_options
        self._index = index
        self._by_key: dict[str, int] = {}
        self._docs: dict[int, tuple[str, str, dict[str, Any]]] = {}
        self._next = 0

    @property
    def embeddings(self) -> Embeddings:
        """The embedding model."""
        return self._embedding

    @property
    def index(self) -> Index | None:
        """The underlying index (``None`` before the first add)."""
        return self._index

    def _ensure_index(self, dim: int) -> Index:
        if self._index is None:
            self._index = Index(dim, metric=self._metric, backend=self._backend, **self._options)
        return self._index

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        *,
        ids: list[str | None] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Embeds and stores ``texts``; a given id that is present is replaced."""
        texts = list(texts)
        if metadatas is not None and len(metadatas) != len(texts):
            raise ValueError(f"{len(metadatas)} metadatas for {len(texts)} texts")
        if ids is not None and len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
        if not texts:
            return []
        keys = [
            (ids[i] if ids is not None and ids[i] is not None else str(uuid.uuid4()))
            for i in range(len(texts))
        ]
        # Everything is checked and built before the store changes: a bad
        # metadata or a refused vector leaves it as it was.
        metas = []
        for i, m in enumerate(metadatas if metadatas is not None else [None] * len(texts)):
            if m is not None and not isinstance(m, dict):
                raise TypeError(f"metadatas[{i}] must be a dict or None, got {type(m).__name__}")
            metas.append(dict(m) if m else {})
        # The last of a repeated key wins, as for repeated upserts.
        last = {key: i for i, key in enumerate(keys)}
        order = sorted(last.values())
        vectors = np.asarray(
            self._embedding.embed_documents([texts[i] for i in order]), dtype=np.float32
        )
        with self._lock.write():
            index = self._ensure_index(vectors.shape[1])
            new_keys: dict[str, int] = {}
            int_ids = []
            for i in order:
                key = keys[i]
                n = self._by_key.get(key)
                if n is None:
                    n = new_keys[key] = self._next + len(new_keys)
                int_ids.append(n)
            index.upsert(vectors, np.asarray(int_ids, dtype=np.int64))
            self._by_key.update(new_keys)
            self._next += len(new_keys)
            for i, n in zip(order, int_ids, strict=True):
                self._docs[n] = (keys[i], texts[i], metas[i])
        return keys

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Removes the documents of ``ids`` (all of them when ``None``);
        absent ids are ignored."""
        with self._lock.write():
            if ids is None:
                ids = list(self._by_key)
            gone = [self._by_key.pop(key) for key in ids if key in self._by_key]
            for n in gone:
                self._docs.pop(n, None)
            if gone and self._index is not None:
                self._index.remove(np.asarray(gone, dtype=np.int64))
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents of ``ids`` that are present, in the order given."""
        out = []
        with self._lock.read():
            for key in ids:
                n = self._by_key.get(key)
                if n is not None:
                    out.append(self._document(n))
        return out

    def _document(self, n: int) -> Document:
        key, text, meta = self._docs[n]
        return Document(id=key, page_content=text, metadata=dict(meta))

    def _allowed(self, filter: _Filter) -> np.ndarray | None:
        if filter is None:
            return None
        if callable(filter):
            keep = [n for n in self._docs if filter(self._document(n))]
        else:
            keep = [
                n
                for n, (_, _, meta) in self._docs.items()
                if all(k in meta and meta[k] == v for k, v in filter.items())
            ]
        return np.asarray(keep, dtype=np.int64)

    def similarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, filter: _Filter = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The ``k`` best documents for a query vector, with their scores."""
        query = np.asarray(embedding, dtype=np.float32)
        with self._lock.read():
            if self._index is None or len(self._index) == 0:
                return []
            scores, ids = self._index.search(query, k, filter=self._allowed(filter))
            return [
                (self._document(int(n)), float(s))
                for s, n in zip(scores, ids, strict=True)
                if n >= 0
            ]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: _Filter = None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The ``k`` best documents for ``query``, with their scores."""
        return self.similarity_search_with_score_by_vector(
            self._embedding.embed_query(query), k, filter=filter, **kwargs
        )

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: _Filter = None, **kwargs: Any
    ) -> list[Document]:
        """The ``k`` best documents for a query vector."""
        return [
            doc
            for doc, _ in self.similarity_search_with_score_by_vector(
                embedding, k, filter=filter, **kwargs
            )
        ]

    def similarity_search(
        self, query: str, k: int = 4, filter: _Filter = None, **kwargs: Any
    ) -> list[Document]:
        """The ``k`` best documents for ``query``."""
        return [
            doc for doc, _ in self.similarity_search_with_score(query, k, filter=filter, **kwargs)
        ]

    def max_marginal_relevance_search_by_vector(
        self,
        embedding: list[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: _Filter = None,
        **kwargs: Any,
    ) -> list[Document]:
        """``k`` documents chosen by maximal marginal relevance among the
        exact ``fetch_k`` best (those that pass ``filter``): each next pick
        maximises ``lambda_mult * sim(query)`` minus
        ``(1 - lambda_mult) * max(sim(picked))``, its similarities to the
        query and to the picks so far (LangChain's
        ``maximal_marginal_relevance``, cosine)."""
        query = np.asarray(embedding, dtype=np.float32)
        with self._lock.read():
            if self._index is None or len(self._index) == 0:
                return []
            _, ids = self._index.search(query, max(fetch_k, k), filter=self._allowed(filter))
            found = [int(n) for n in ids if n >= 0]
            if not found:
                return []
            vectors = np.stack([self._index.get(n) for n in found])
            docs = [self._document(n) for n in found]
        picked = maximal_marginal_relevance(query, vectors, lambda_mult=lambda_mult, k=k)
        return [docs[i] for i in picked]

    def max_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: _Filter = None,
        **kwargs: Any,
    ) -> list[Document]:
        """:meth:`max_marginal_relevance_search_by_vector` for ``query``."""
        return self.max_marginal_relevance_search_by_vector(
            self._embedding.embed_query(query), k, fetch_k, lambda_mult, filter=filter, **kwargs
        )

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """Relevance in [0, 1], higher for better matches, from the index's
        score. Cosine maps [-1, 1] onto it; a dot product the same way, which
        is exact for unit vectors (where it is the cosine) and clipped beyond;
        a squared L2 distance ``d`` of unit vectors gives ``1 - sqrt(d / 2)``."""
        if self._metric == "cosine":
            return lambda s: (1.0 + s) / 2.0
        if self._metric == "l2":
            return lambda d: max(0.0, 1.0 - math.sqrt(max(d, 0.0)) / math.sqrt(2.0))
        # The index's dot product is a similarity, not LangChain's negated
        # inner-product distance.
        return lambda s: min(1.0, max(0.0, (1.0 + s) / 2.0))

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> TopkVectorStore:
        """A store of ``texts``; ``kwargs`` go to the constructor
        (``metric``, ``backend``, index options)."""
        store = cls(embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    def save_local(self, folder: str | Path) -> None:
        """Writes the index and the documents (metadata must be JSON) to
        ``folder``, as one change: the documents are encoded first (a value
        JSON cannot hold is an error that writes nothing), the index goes to
        a file of its own, and ``docs.json``, written last and atomically,
        names it; the files of earlier saves are deleted after. A crash at
        any point leaves the previous save whole."""
        folder = Path(folder)
        with self._lock.write():
            index_file = f"index-{uuid.uuid4().hex}.topkidx" if self._index is not None else None
            docs = {
                "metric": self._metric,
                "next": self._next,
                "index": index_file,
                "docs": [[n, key, text, meta] for n, (key, text, meta) in self._docs.items()],
            }
            encoded = json.dumps(docs)
            folder.mkdir(parents=True, exist_ok=True)
            if self._index is not None:
                self._index.save(folder / index_file)
            tmp = folder / f".{_DOCS_FILE}.{uuid.uuid4().hex}.tmp"
            try:
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(encoded)
                    f.flush()
                    os.fsync(f.fileno())
                tmp.replace(folder / _DOCS_FILE)
            except BaseException:
                tmp.unlink(missing_ok=True)
                if index_file is not None:
                    (folder / index_file).unlink(missing_ok=True)
                raise
            _sync_folder(folder)
            for old in folder.glob("index*.topkidx"):
                if old.name != index_file and _SAVED_INDEX.fullmatch(old.name):
                    old.unlink(missing_ok=True)

    @classmethod
    def load_local(
        cls, folder: str | Path, embedding: Embeddings, *, backend: str | None = None
    ) -> TopkVectorStore:
        """A store read back from a folder written by :meth:`save_local`, on
        ``backend`` (by default as :meth:`topk.Index.open` chooses: ``hnsw``
        when the file holds a graph, ``cpu`` otherwise)."""
        folder = Path(folder)
        saved = json.loads((folder / _DOCS_FILE).read_text(encoding="utf-8"))
        # Folders saved before the docs file named the index hold index.topkidx.
        name = saved.get("index", _INDEX_FILE if (folder / _INDEX_FILE).exists() else None)
        index = Index.open(folder / name, backend=backend) if name is not None else None
        chosen = index.backend if index is not None else (backend or "cpu")
        store = cls(embedding, metric=saved["metric"], backend=chosen)
        store._index = index
        store._next = saved["next"]
        for n, key, text, meta in saved["docs"]:
            store._docs[n] = (key, text, meta)
            store._by_key[key] = n
        return store


def _sync_folder(folder: Path) -> None:
    """Makes a rename into ``folder`` durable where the OS allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
