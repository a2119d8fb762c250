"""Fixtures for the Megatron backend tests: tiny HF models of each family, a CPU Megatron run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# megatron_cpu.py (the shim and the spawned workers) imports by name here and in the processes
# spawn() starts, which inherit sys.path but not pytest's importlib-mode module names.
sys.path.insert(0, str(Path(__file__).parent))

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe")


def tiny_hf_config(family: str, **overrides: object) -> object:
    """A tiny transformers config: GQA (4 query heads, 2 key/value heads), 2 layers; the MoE
    one has 4 experts of width 32, 2 per token."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
    cls = {**classes, "qwen3_moe": Qwen3MoeConfig}[family]
    kwargs: dict[str, object] = {
        "vocab_size": 96,
        "hidden_size": 64,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        # Llama and Qwen3-MoE untie their embeddings, the dense Qwen models tie them.
        "tie_word_embeddings": family not in ("llama", "qwen3_moe"),
    }
    if family in ("qwen3", "qwen3_moe"):
        kwargs["head_dim"] = 16
    if family == "qwen3_moe":
        kwargs.update(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True
        )
    kwargs.update(overrides)
    return cls(**kwargs)


def build_tiny_hf(family: str, folder: Path, seed: int = 0) -> Path:
    """Save a random tiny ``family`` model (fp32 safetensors) into ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_hf_config(family), dtype=torch.float32)
    with torch.no_grad():
        # Norm weights start at exactly 1 and biases at 0; perturb them so the converter
        # cannot pass by mixing them up.
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One saved tiny model folder per family."""
    root = tmp_path_factory.mktemp("megatron_tiny")
    return {f: build_tiny_hf(f, root / f) for f in FAMILIES}


@pytest.fixture
def megatron_cpu() -> Iterator[None]:
    """Run megatron-core on the CPU (test-only shim); tear its process groups down after."""
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from megatron_cpu import cpu_shim

    with cpu_shim():
        yield
    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def make_hf_config() -> Any:
    """The tiny config factory: ``make_hf_config(family, **overrides)``."""
    return tiny_hf_config
