"""Retrieval over real embeddings: build, save, reopen, search, filter.

Reads ../shared/data/minilm-docs-20k (20,000 MiniLM chunk embeddings with
their texts, and 500 query embeddings), builds a cosine topk.Index, saves it,
opens it again, prints the best chunks for a few queries, then searches only
the chunks of one source (man pages) through an id allow-list.

    pip install ./crates/topk-py
    python examples/python/retrieve.py [DATA_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import topk

HERE = Path(__file__).resolve().parent
DEFAULT = HERE.parents[2] / "shared" / "data" / "minilm-docs-20k"


def main() -> int:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    if not (data / "corpus.npy").exists():
        print(f"no data at {data}: pass the minilm-docs-20k folder", file=sys.stderr)
        return 2
    corpus = np.load(data / "corpus.npy")
    queries = np.load(data / "queries.npy")
    docs: dict[int, dict] = {}
    asks: dict[int, str] = {}
    with open(data / "texts.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            (docs if rec["kind"] == "corpus" else asks)[rec["id"]] = rec
    ids = np.arange(len(corpus), dtype=np.int64)

    t = time.perf_counter()
    idx = topk.Index(corpus.shape[1], metric="cosine")
    idx.add(corpus, ids=ids)
    print(f"built {idx!r} in {time.perf_counter() - t:.2f} s")

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "minilm.topkidx"
        idx.save(path)
        idx = topk.Index.open(path)
        print(f"saved and reopened {path.name}: {path.stat().st_size / 2**20:.1f} MiB")

    scores, hits = idx.search(queries[:3], 3)
    for q in range(3):
        print(f"\nquery: {asks[q]['text'][:100]!r}")
        for s, h in zip(scores[q], hits[q], strict=True):
            print(f"  {s:.3f}  [{docs[int(h)]['src']}] {docs[int(h)]['text'][:90]!r}")

    man = np.array([i for i, d in docs.items() if d["src"] == "man"], dtype=np.int64)
    scores, hits = idx.search(queries[0], 3, filter=man)
    print(f"\nthe same first query, man pages only ({len(man)} of {len(docs)} chunks):")
    for s, h in zip(scores, hits, strict=True):
        print(f"  {s:.3f}  [{docs[int(h)]['src']}] {docs[int(h)]['text'][:90]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
