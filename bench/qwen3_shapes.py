"""Qwen3 dense model shapes (random weights) for GPU benchmarks: HF configs without a download."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QWEN3_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "intermediate_size": 3072,
    },
    "qwen3-1.7b": {
        "hidden_size": 2048,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "intermediate_size": 6144,
    },
    "qwen3-4b": {
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "intermediate_size": 9728,
    },
}


def qwen3_config(name: str) -> Any:
    """A transformers ``Qwen3Config`` shaped like the released model ``name`` (tied embeddings)."""
    from transformers import Qwen3Config

    if name not in QWEN3_SHAPES:
        raise ValueError(f"unknown shape {name!r}; choose one of {sorted(QWEN3_SHAPES)}")
    return Qwen3Config(
        vocab_size=151936,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        **QWEN3_SHAPES[name],
    )


def write_config_folder(name: str, folder: str | Path) -> Path:
    """A folder holding only ``config.json`` (enough for random-init trainers)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(qwen3_config(name).to_dict()))
    return folder
