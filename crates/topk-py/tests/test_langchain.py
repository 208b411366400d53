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


def test_a_save_that_fails_writes_nothing_and_the_previous_save_loads(tmp_path) -> None:
    import datetime

    emb = DeterministicFakeEmbedding(size=16)
    folder = tmp_path / "store"
    store = TopkVectorStore.from_texts(["a", "b"], emb, ids=["1", "2"])
    store.save_local(folder)
    before = sorted(p.name for p in folder.iterdir())
    store.add_texts(["c"], metadatas=[{"t": datetime.datetime(2026, 1, 1)}], ids=["3"])
    with pytest.raises(TypeError):
        store.save_local(folder)
    assert sorted(p.name for p in folder.iterdir()) == before
    back = TopkVectorStore.load_local(folder, emb)
    assert sorted(d.id for d in back.similarity_search("a", k=5)) == ["1", "2"]
    # A later save replaces the pair and leaves one index file.
    store.delete(["3"])
    store.save_local(folder)
    assert len(list(folder.glob("*.topkidx"))) == 1
    assert sorted(
        d.id for d in TopkVectorStore.load_local(folder, emb).similarity_search("a", k=5)
    ) == ["1", "2"]
    # An empty store saved over a used folder leaves no stale index.
    TopkVectorStore(emb).save_local(folder)
    assert list(folder.glob("*.topkidx")) == []
    assert TopkVectorStore.load_local(folder, emb).similarity_search("a", k=5) == []


def test_a_folder_saved_with_the_old_index_name_still_loads(
    tmp_path, store: TopkVectorStore
) -> None:
    import json

    folder = tmp_path / "old"
    store.save_local(folder)
    [index_file] = folder.glob("*.topkidx")
    index_file.rename(folder / "index.topkidx")
    docs = json.loads((folder / "docs.json").read_text())
    del docs["index"]
    (folder / "docs.json").write_text(json.dumps(docs))
    back = TopkVectorStore.load_local(folder, DeterministicFakeEmbedding(size=16))
    assert back.similarity_search("dates", k=2) == store.similarity_search("dates", k=2)


def test_a_refused_add_changes_nothing() -> None:
    import topk

    s = TopkVectorStore(DeterministicFakeEmbedding(size=16), index=topk.Index(8))
    with pytest.raises(topk.InvalidInputError):
        s.add_texts(["a"], ids=["k"])
    assert s.get_by_ids(["k"]) == []
    s = TopkVectorStore(DeterministicFakeEmbedding(size=16))
    s.add_texts(["x"], ids=["x"])
    with pytest.raises(TypeError, match="metadatas\\[1\\]"):
        s.add_texts(["a", "b"], metadatas=[{}, 5])  # type: ignore[list-item]
    assert [d.id for d in s.similarity_search("b", k=5)] == ["x"]
    assert s.add_texts(["a"], ids=["k"]) == ["k"]
    assert s.get_by_ids(["k"])[0].page_content == "a"


def test_an_index_with_rows_but_no_documents_is_refused() -> None:
    import numpy as np

    import topk

    idx = topk.Index(16)
    idx.add(np.ones((1, 16), np.float32))
    with pytest.raises(ValueError, match="1 rows without documents"):
        TopkVectorStore(DeterministicFakeEmbedding(size=16), index=idx)


def test_dot_relevance_is_higher_for_better_matches() -> None:
    s = TopkVectorStore.from_texts(
        ["near", "far"], DeterministicFakeEmbedding(size=16), ids=["n", "f"], metric="dot"
    )
    q = s.embeddings.embed_query("near")
    hits = s.similarity_search_with_score_by_vector(q, k=2)
    rel = s._select_relevance_score_fn()
    scores = [score for _, score in hits]
    assert scores == sorted(scores, reverse=True)
    rels = [rel(score) for score in scores]
    assert rels == sorted(rels, reverse=True) and all(0.0 <= r <= 1.0 for r in rels)
    assert rel(1.0) == 1.0 and rel(-1.0) == 0.0


@pytest.mark.parametrize("name", ["L2", "euclidean", "l2"])
def test_l2_relevance_follows_the_metric_under_any_of_its_names(name: str) -> None:
    s = TopkVectorStore.from_texts(
        ["near", "far"], DeterministicFakeEmbedding(size=16), ids=["n", "f"], metric=name
    )
    hits = s.similarity_search_with_relevance_scores("near", k=2)
    assert [d.id for d, _ in hits] == ["n", "f"]
    rels = [r for _, r in hits]
    assert rels[0] == 1.0 and rels[0] > rels[1] >= 0.0
    rel = s._select_relevance_score_fn()
    assert rel(0.0) == 1.0 and rel(4.0) == 0.0


def test_concurrent_adds_keep_every_document() -> None:
    import threading

    s = TopkVectorStore(DeterministicFakeEmbedding(size=16))

    def add(t: int) -> None:
        for i in range(20):
            s.add_texts([f"t{t}-{i}", f"u{t}-{i}"])

    threads = [threading.Thread(target=add, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.index is not None and len(s.index) == 160
    assert len(s.similarity_search("t0-0", k=200)) == 160


def test_searches_beside_adds_and_deletes_see_whole_documents() -> None:
    """Searches, MMR and filtered searches on some threads while others add
    and delete: every hit is a whole document (no KeyError, no missing
    vector), and the store ends with what the writers left."""
    import threading

    s = TopkVectorStore(DeterministicFakeEmbedding(size=16))
    s.add_texts(["seed"], [{"w": -1}], ids=["seed"])
    failures: list[BaseException] = []
    stop = threading.Event()

    def write(t: int) -> None:
        try:
            for i in range(40):
                key = f"w{t}-{i}"
                s.add_texts([key], [{"w": t}], ids=[key])
                if i % 2:
                    s.delete([key])
        except BaseException as e:
            failures.append(e)

    def read() -> None:
        try:
            while not stop.is_set():
                for doc, _ in s.similarity_search_with_score("w0-1", k=10):
                    assert doc.page_content == doc.id
                for doc in s.similarity_search("w1-2", k=5, filter={"w": 1}):
                    assert doc.metadata == {"w": 1}
                for doc in s.max_marginal_relevance_search("w1-3", k=3, fetch_k=8):
                    assert doc.page_content == doc.id
        except BaseException as e:
            failures.append(e)

    readers = [threading.Thread(target=read) for _ in range(3)]
    writers = [threading.Thread(target=write, args=(t,)) for t in range(2)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert failures == []
    assert s.index is not None and len(s.index) == 1 + 2 * 20
    assert len(s.get_by_ids([f"w{t}-{i}" for t in range(2) for i in range(0, 40, 2)])) == 40


def test_load_local_keeps_an_hnsw_store_on_hnsw(tmp_path) -> None:
    emb = DeterministicFakeEmbedding(size=16)
    s = TopkVectorStore.from_texts([f"t{i}" for i in range(50)], emb, backend="hnsw")
    assert s.index is not None and s.index.backend == "hnsw"
    s.save_local(tmp_path / "h")
    back = TopkVectorStore.load_local(tmp_path / "h", emb)
    assert back.index is not None and back.index.backend == "hnsw"
    assert back.similarity_search("t7", k=3) == s.similarity_search("t7", k=3)
    exact = TopkVectorStore.load_local(tmp_path / "h", emb, backend="cpu")
    assert exact.index is not None and exact.index.backend == "cpu"


def test_mmr_spreads_the_picks_over_near_duplicates() -> None:
    from langchain_core.embeddings import Embeddings

    table = {
        "q": [1.0, 0.0, 0.0],
        "a": [0.99, 0.14, 0.0],
        "a2": [0.99, 0.14, 0.0],
        "b": [0.8, 0.0, 0.6],
    }

    class Fixed(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return [table[t] for t in texts]

        def embed_query(self, text: str) -> list[float]:
            return table[text]

    s = TopkVectorStore.from_texts(["a", "a2", "b"], Fixed(), ids=["a", "a2", "b"])
    plain = [d.id for d in s.similarity_search("q", k=2)]
    assert plain == ["a", "a2"]
    mmr = [d.id for d in s.max_marginal_relevance_search("q", k=2, fetch_k=3, lambda_mult=0.3)]
    assert mmr == ["a", "b"]
    assert [d.id for d in s.max_marginal_relevance_search("q", k=2, filter={"x": 1})] == []
    retriever = s.as_retriever(search_type="mmr", search_kwargs={"k": 2, "lambda_mult": 0.3})
    assert [d.id for d in retriever.invoke("q")] == ["a", "b"]
