"""Shared helpers of the Python tests."""

from __future__ import annotations

import os

import numpy as np
import pytest


def same_bytes(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> None:
    """Asserts two search results are the same bytes: score bits and ids."""
    (sa, ia), (sb, ib) = a, b
    assert sa.dtype == sb.dtype == np.float32
    assert ia.dtype == ib.dtype == np.int64
    assert sa.shape == sb.shape and ia.shape == ib.shape
    np.testing.assert_array_equal(sa.view(np.uint32), sb.view(np.uint32))
    np.testing.assert_array_equal(ia, ib)


def gpu_or_skip() -> object:
    """torch with a CUDA device, or a skip with the reason (a failure under
    TOPK_REQUIRE_GPU=1)."""
    try:
        import torch
    except ImportError:
        reason = "torch is not installed"
    else:
        if torch.cuda.is_available():
            return torch
        reason = "torch sees no CUDA device"
    if os.environ.get("TOPK_REQUIRE_GPU") == "1":
        pytest.fail(f"TOPK_REQUIRE_GPU=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20)
