"""The README's Python quickstart and examples/python/retrieve.py run as
written (the example needs ../shared/data/minilm-docs-20k and skips without
it, unless TOPK_REQUIRE_DATA=1 makes its absence a failure)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import topk
from conftest import same_bytes

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT.parent / "shared" / "data" / "minilm-docs-20k"


def need_data() -> None:
    """Skips where the real embeddings are absent; fails instead under
    TOPK_REQUIRE_DATA=1."""
    if (DATA / "corpus.npy").is_file():
        return
    if os.environ.get("TOPK_REQUIRE_DATA") == "1":
        pytest.fail(f"TOPK_REQUIRE_DATA=1 but {DATA} holds no corpus.npy")
    pytest.skip(f"{DATA} holds no corpus.npy (set TOPK_REQUIRE_DATA=1 to fail instead)")


def test_the_readme_quickstart_runs(tmp_path, monkeypatch) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## From Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "README.md: no python block under 'From Python'"
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code.group(1), "README.md", "exec"), scope)
    same_bytes(
        scope["same"].search(scope["docs"][:3], 4), scope["idx"].search(scope["docs"][:3], 4)
    )


def test_the_retrieval_example_runs() -> None:
    need_data()
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples/python/retrieve.py"), str(DATA)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "saved and reopened" in out and "man pages only" in out
    assert out.count("[man]") >= 3


def test_real_embeddings_are_the_same_bytes_on_both_exact_backends() -> None:
    need_data()
    corpus = np.load(DATA / "corpus.npy")[:5000]
    queries = np.load(DATA / "queries.npy")[:20]
    for metric in ["cosine", "dot", "l2"]:
        cpu = topk.Index(corpus.shape[1], metric=metric, backend="cpu")
        oracle = topk.Index(corpus.shape[1], metric=metric, backend="oracle")
        cpu.add(corpus)
        oracle.add(corpus)
        same_bytes(cpu.search(queries, 50), oracle.search(queries, 50))
