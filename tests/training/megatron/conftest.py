"""Fixtures for the Megatron backend tests: tiny HF models of each family, a CPU Megatron run."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

FAMILIES = ("llama", "qwen2", "qwen3")


def tiny_hf_config(family: str, **overrides: object) -> object:
    """A tiny transformers config: GQA (4 query heads, 2 key/value heads), 2 layers."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[family]
    kwargs: dict[str, object] = {
        "vocab_size": 96,
        "hidden_size": 64,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        # Llama unties its embeddings, the Qwen models tie them: both paths are covered.
        "tie_word_embeddings": family != "llama",
    }
    if family == "qwen3":
        kwargs["head_dim"] = 16
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


# ---- test-only CPU shim -------------------------------------------------------------------
# megatron-core hard-codes CUDA in a few places (``torch.cuda.current_device()`` for RoPE and
# buffers, ``device='cuda'`` in optimizer scalars, a ``torch.cuda.FloatTensor`` type assertion in
# gradient clipping). Inside ``cpu_shim()`` those resolve to the CPU; nothing in vime uses it.
_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "empty_like")


def _to_cpu(device: Any) -> Any:
    if device is None:
        return None
    if isinstance(device, int) or str(device).startswith("cuda"):
        return "cpu"
    return device


def _wrap(fn: Any) -> Any:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = _to_cpu(kwargs["device"])
        return fn(*args, **kwargs)

    return call


def _cuda_type_name(original: Any) -> Any:
    """``Tensor.type()`` naming CPU tensors as CUDA ones (Megatron asserts the name)."""

    @functools.wraps(original)
    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return original(self, *args, **kwargs)
        return original(self).replace("torch.", "torch.cuda.", 1)

    return type_


@contextlib.contextmanager
def cpu_shim() -> Iterator[None]:
    """Redirect megatron-core's hard-coded CUDA device uses to the CPU inside the block."""
    patches: list[tuple[Any, str, Any]] = [
        (torch.cuda, "current_device", lambda: "cpu"),
        (torch.cuda, "synchronize", lambda *a, **k: None),
        (torch.Tensor, "cuda", lambda self, *a, **k: self),
        (torch.Tensor, "type", _cuda_type_name(torch.Tensor.type)),
    ]
    patches += [(torch, name, _wrap(getattr(torch, name))) for name in _FACTORIES]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


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
