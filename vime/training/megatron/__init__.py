"""Megatron-core trainer backend: GPT models for Llama/Qwen2/Qwen3, HF<->Megatron conversion.

Names load lazily so that ``import vime.training.megatron`` imports neither torch nor megatron.
"""

from __future__ import annotations

from vime.lazy import lazy_exports

_LAZY = {
    "MegatronTrainer": "vime.training.megatron.trainer",
    "MegatronConfig": "vime.training.megatron.config",
    "parse_megatron_args": "vime.training.megatron.config",
    "GPTArch": "vime.training.megatron.arch",
    "arch_from_hf_config": "vime.training.megatron.arch",
    "build_gpt_model": "vime.training.megatron.model",
}

__all__ = list(_LAZY)


__getattr__ = lazy_exports(__name__, _LAZY, globals())
