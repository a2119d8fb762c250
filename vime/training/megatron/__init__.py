"""Megatron-core trainer backend: GPT models for Llama/Qwen2/Qwen3, HF<->Megatron conversion.

Names load lazily so that ``import vime.training.megatron`` imports neither torch nor megatron.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "MegatronTrainer": "vime.training.megatron.trainer",
    "MegatronConfig": "vime.training.megatron.config",
    "parse_megatron_args": "vime.training.megatron.config",
    "GPTArch": "vime.training.megatron.arch",
    "arch_from_hf_config": "vime.training.megatron.arch",
    "build_gpt_model": "vime.training.megatron.model",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vime.training.megatron' has no attribute {name!r}")
