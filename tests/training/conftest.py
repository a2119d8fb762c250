"""Fixtures for trainer tests: tiny HF model folders built offline, and batches on them."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Test modules import trainer_data by name, and so must the processes spawn() starts (they
# inherit sys.path, not pytest's importlib-mode module names).
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, hidden-64 random Llama (tied embeddings) with SmolLM2's tokenizer."""
    from vime.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", family="llama", seed=0)


@pytest.fixture(scope="session")
def untied_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 with its own lm_head (untied), small vocab, no tokenizer."""
    from trainer_data import build_untied_qwen3

    return build_untied_qwen3(tmp_path_factory.mktemp("untied") / "qwen3")


BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def train_mfu():
    """bench/train_mfu.py loaded as a module (bench/ on sys.path for its own imports)."""
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("train_mfu_under_test", BENCH / "train_mfu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(BENCH))
