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

import json
import math
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore

from ._topk import Index

__all__ = ["TopkVectorStore"]

_Filter = dict[str, Any] | Callable[[Document], bool] | None

_INDEX_FILE = "index.topkidx"
_DOCS_FILE = "docs.json"


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
        self._embedding = embedding
        self._metric = index.metric if index is not None else metric
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
        # The last of a repeated key wins, as for repeated upserts.
        last = {key: i for i, key in enumerate(keys)}
        order = sorted(last.values())
        vectors = np.asarray(
            self._embedding.embed_documents([texts[i] for i in order]), dtype=np.float32
        )
        index = self._ensure_index(vectors.shape[1])
        int_ids = []
        for i in order:
            key = keys[i]
            if key not in self._by_key:
                self._by_key[key] = self._next
                self._next += 1
            int_ids.append(self._by_key[key])
        index.upsert(vectors, np.asarray(int_ids, dtype=np.int64))
        for i, n in zip(order, int_ids, strict=True):
            meta = dict(metadatas[i]) if metadatas is not None and metadatas[i] else {}
            self._docs[n] = (keys[i], texts[i], meta)
        return keys

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Removes the documents of ``ids`` (all of them when ``None``);
        absent ids are ignored."""
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
        if self._index is None or len(self._index) == 0:
            return []
        query = np.asarray(embedding, dtype=np.float32)
        scores, ids = self._index.search(query, k, filter=self._allowed(filter))
        return [
            (self._document(int(n)), float(s)) for s, n in zip(scores, ids, strict=True) if n >= 0
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

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        if self._metric == "cosine":
            return lambda s: (1.0 + s) / 2.0
        if self._metric == "l2":
            return lambda d: 1.0 - math.sqrt(max(d, 0.0)) / math.sqrt(2.0)
        return self._max_inner_product_relevance_score_fn

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
        """Writes the index and the documents (metadata must be JSON) to ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if self._index is not None:
            self._index.save(folder / _INDEX_FILE)
        docs = {
            "metric": self._metric,
            "next": self._next,
            "docs": [[n, key, text, meta] for n, (key, text, meta) in self._docs.items()],
        }
        tmp = folder / (_DOCS_FILE + ".tmp")
        tmp.write_text(json.dumps(docs), encoding="utf-8")
        tmp.replace(folder / _DOCS_FILE)

    @classmethod
    def load_local(
        cls, folder: str | Path, embedding: Embeddings, *, backend: str = "cpu"
    ) -> TopkVectorStore:
        """A store read back from a folder written by :meth:`save_local`."""
        folder = Path(folder)
        saved = json.loads((folder / _DOCS_FILE).read_text(encoding="utf-8"))
        index_path = folder / _INDEX_FILE
        index = Index.open(index_path, backend=backend) if index_path.exists() else None
        store = cls(embedding, metric=saved["metric"], backend=backend, index=index)
        store._next = saved["next"]
        for n, key, text, meta in saved["docs"]:
            store._docs[n] = (key, text, meta)
            store._by_key[key] = n
        return store
