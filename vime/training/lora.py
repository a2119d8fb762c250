"""LoRA adapters of our own: ``y = x W^T + b + scale * (x A^T) B^T`` on chosen ``nn.Linear`` layers.

``A`` (rank x in) starts random, ``B`` (out x rank) starts at zero, so the wrapped model equals
the base model at init; ``scale = alpha / rank``. The base weight and bias are frozen.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from collections.abc import Iterable


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        base.weight.requires_grad_(False)
        if base.bias is not None:
            base.bias.requires_grad_(False)
        self.rank = rank
        self.scale = alpha / rank
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(rank, w.shape[1], dtype=w.dtype, device=w.device))
        self.lora_B = nn.Parameter(torch.zeros(w.shape[0], rank, dtype=w.dtype, device=w.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        delta = (x.to(self.lora_A.dtype) @ self.lora_A.t()) @ self.lora_B.t()
        return out + (self.scale * delta).to(out.dtype)

    def merged_weight(self) -> torch.Tensor:
        """``W + scale * B @ A`` (detached)."""
        with torch.no_grad():
            return self.base.weight + self.scale * (self.lora_B @ self.lora_A).to(
                self.base.weight.dtype
            )


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: Iterable[str]) -> list[str]:
    """Freeze ``model`` and wrap every ``nn.Linear`` whose attribute name is in ``targets``.

    Returns the wrapped modules' qualified names; raises if none matched.
    """
    wanted = set(targets)
    for p in model.parameters():
        p.requires_grad_(False)
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in wanted
    ]
    if not found:
        raise ValueError(
            f"--lora-target-modules {sorted(wanted)} matched no nn.Linear in the model"
        )
    for name, module in found:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, LoRALinear(module, rank, alpha))
    return [name for name, _ in found]


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """Qualified name -> :class:`LoRALinear` of every adapter in ``model``."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def save_peft_adapter(model: nn.Module, directory: str | Path, base_model: str = "") -> Path:
    """Write the adapters as a PEFT-format folder: ``adapter_config.json`` plus
    ``adapter_model.safetensors`` with keys ``base_model.model.<module>.lora_A.weight`` /
    ``lora_B.weight`` (A: rank x in, B: out x rank)."""
    import json

    from safetensors.torch import save_file

    adapters = lora_modules(model)
    if not adapters:
        raise ValueError("the model has no LoRA adapters")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, module in adapters.items():
        prefix = f"base_model.model.{name}"
        tensors[f"{prefix}.lora_A.weight"] = module.lora_A.detach().contiguous().cpu()
        tensors[f"{prefix}.lora_B.weight"] = module.lora_B.detach().contiguous().cpu()
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    first = next(iter(adapters.values()))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": first.rank,
        "lora_alpha": first.scale * first.rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "target_modules": sorted({n.rsplit(".", 1)[-1] for n in adapters}),
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
