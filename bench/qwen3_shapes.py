"""Qwen3 model shapes (random weights) for GPU benchmarks: HF configs without a download.

Dense shapes follow the released Qwen3 models (tied embeddings); ``qwen3-moe-*`` shapes are
small Qwen3-MoE models (untied embeddings, as the released MoE models) for MoE throughput.
"""

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
    # 12 layers of 16 experts, 2 per token: ~2.6B weights, ~0.9B active per token.
    "qwen3-moe-16x2": {
        "hidden_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 16,
        "intermediate_size": 6144,
        "num_experts": 16,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1536,
        "norm_topk_prob": True,
    },
    # The same layout at test size, for a CPU check of the bench's MoE path.
    "qwen3-moe-tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 96,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "head_dim": 16,
        "vocab_size": 128,
    },
}


def shape_fields(name: str) -> dict[str, Any]:
    """The fields of shape ``name``: a key of :data:`QWEN3_SHAPES`, or ``KEY@LAYERS``, that
    shape with its first ``LAYERS`` layers only (``qwen3-4b@24``: the 4B model's layers, few
    enough for an 80 GB card's trainers)."""
    base, _, layers = name.partition("@")
    if base not in QWEN3_SHAPES:
        raise ValueError(f"unknown shape {name!r}; choose one of {sorted(QWEN3_SHAPES)}, "
                         "optionally as NAME@LAYERS")  # fmt: skip
    fields = dict(QWEN3_SHAPES[base])
    if layers:
        full = fields["num_hidden_layers"]
        if not layers.isdigit() or not 1 <= int(layers) <= full:
            raise ValueError(f"shape {name!r}: the layers after '@' must be a whole number "
                             f"from 1 to {base}'s {full}")  # fmt: skip
        fields["num_hidden_layers"] = int(layers)
    return fields


def qwen3_config(name: str) -> Any:
    """A transformers ``Qwen3Config`` shaped like the released model ``name`` (tied embeddings),
    or a ``Qwen3MoeConfig`` for the ``qwen3-moe-*`` shapes (untied); ``NAME@LAYERS`` keeps
    that many of its layers (:func:`shape_fields`)."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    shape = shape_fields(name)
    moe = "num_experts" in shape
    fields: dict[str, Any] = {
        "vocab_size": 151936,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": not moe,
        **shape,
    }
    if moe:
        fields["num_key_value_heads"] = min(
            fields["num_key_value_heads"], fields["num_attention_heads"]
        )
        return Qwen3MoeConfig(**fields)
    return Qwen3Config(**fields)


def write_config_folder(name: str, folder: str | Path) -> Path:
    """A folder holding only ``config.json`` (enough for random-init trainers)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(qwen3_config(name).to_dict()))
    return folder
