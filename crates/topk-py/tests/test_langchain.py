"""topk.langchain.TopkVectorStore: LangChain's own standard suite, then
filters, scores and save / load."""

from __future__ import annotations

from collections.abc import Generator

import pytest

pytest.importorskip("langchain_core", reason="langchain-core is not installed")
pytest.importorskip("langchain_tests", reason="langchain-tests is not installed")

from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import VectorStore
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from topk.langchain import TopkVectorStore


class TestTopkStandard(VectorStoreIntegrationTests):
    """LangChain's standard vector store tests, unchanged."""

    @pytest.fixture
    def vectorstore(self) -> Generator[VectorStore, None, None]:  # type: ignore[override]
        store = TopkVectorStore(self.get_embeddings())
        try:
            yield store
        finally:
            store.delete()


@pytest.fixture
def store() -> TopkVectorStore:
    texts = ["apples", "bananas", "cherries", "dates"]
    metas = [{"src": "a"}, {"src": "b"}, {"src": "a"}, {"src": "b", "n": 1}]
    return TopkVectorStore.from_texts(
        texts, DeterministicFakeEmbedding(size=16), metas, ids=["1", "2", "3", "4"]
    )


def test_metadata_filter_is_an_exact_allow_list(store: TopkVectorStore) -> None:
    docs = store.similarity_search("apples", k=4, filter={"src": "b"})
    assert sorted(d.id for d in docs) == ["2", "4"]
    docs = store.similarity_search("apples", k=4, filter={"src": "b", "n": 1})
    assert [d.id for d in docs] == ["4"]
    docs = store.similarity_search("apples", k=4, filter=lambda d: d.page_content < "c")
    assert sorted(d.id for d in docs) == ["1", "2"]
    assert store.similarity_search("apples", k=4, filter={"src": "zzz"}) == []


def test_scores_are_cosine_similarities(store: TopkVectorStore) -> None:
    [(doc, score)] = store.similarity_search_with_score("cherries", k=1)
    assert doc.page_content == "cherries"
    assert score == pytest.approx(1.0, abs=1e-6)
    [(doc, rel)] = store.similarity_search_with_relevance_scores("cherries", k=1)
    assert rel == pytest.approx(1.0, abs=1e-6)


def test_save_and_load(tmp_path, store: TopkVectorStore) -> None:
    store.save_local(tmp_path / "store")
    back = TopkVectorStore.load_local(tmp_path / "store", DeterministicFakeEmbedding(size=16))
    assert back.similarity_search("dates", k=2) == store.similarity_search("dates", k=2)
    assert back.get_by_ids(["3"]) == [
        Document(id="3", page_content="cherries", metadata={"src": "a"})
    ]
    back.add_texts(["elderberries"], ids=["5"])
    assert back.get_by_ids(["5"])[0].page_content == "elderberries"
    assert back.index is not None and len(back.index) == 5
