"""AdamW with decoupled weight decay and the warmup + constant/linear/cosine LR schedule."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from vime.training.base import TrainerConfig

if TYPE_CHECKING:
    import torch


def lr_at(step: int, config: TrainerConfig) -> float:
    """Learning rate of optimizer step ``step`` (1 for the first step).

    Linear warmup ``lr * step / warmup`` for the first ``lr_warmup_iters`` steps, then
    ``constant``: ``lr``; ``linear``: ``min_lr + (lr - min_lr) (1 - p)``; ``cosine``:
    ``min_lr + (lr - min_lr) (1 + cos(pi p)) / 2`` with ``p`` the decay progress in [0, 1].
    """
    if step < 1:
        raise ValueError(f"optimizer steps count from 1, got {step}")
    warmup = config.lr_warmup_iters
    if step <= warmup:
        return config.lr * step / warmup
    if config.lr_decay_style == "constant":
        return config.lr
    assert config.train_iters is not None  # TrainerConfig checks this for decaying schedules
    progress = min(1.0, (step - warmup) / (config.train_iters - warmup))
    span = config.lr - config.min_lr
    if config.lr_decay_style == "linear":
        return config.min_lr + span * (1.0 - progress)
    return config.min_lr + span * 0.5 * (1.0 + math.cos(math.pi * progress))


class LRSchedule:
    """Sets each param group's ``lr`` before a step; its state is the number of steps taken."""

    def __init__(self, optimizer: torch.optim.Optimizer, config: TrainerConfig) -> None:
        self.optimizer = optimizer
        self.config = config
        self.steps_done = 0

    def apply_next(self) -> float:
        """Set and return the learning rate of the coming step."""
        lr = lr_at(self.steps_done + 1, self.config)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def step(self) -> None:
        """Record that the optimizer took a step."""
        self.steps_done += 1

    def state_dict(self) -> dict[str, Any]:
        """Serializable state."""
        return {"steps_done": self.steps_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.steps_done = int(state["steps_done"])


def build_optimizer(
    model: torch.nn.Module, config: TrainerConfig
) -> tuple[torch.optim.Optimizer, LRSchedule]:
    """AdamW over the trainable parameters; no weight decay on biases and norm weights."""
    import torch

    decay, no_decay = [], []
    for _name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=lr_at(1, config),
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_eps,
        # One kernel per parameter group instead of a dozen foreach passes over the fp32
        # state (Qwen3-4B on an H200: 32 ms a step instead of ~100 ms; SmolLM2-135M on 2 CPU
        # cores: 90 ms instead of 360 ms). Same math, up to fp32 rounding order.
        fused=_fused_adamw_runs_on(p for g in groups for p in g["params"]) or None,
    )
    return optimizer, LRSchedule(optimizer, config)


def _fused_adamw_runs_on(params: Any) -> bool:
    """Whether torch's fused AdamW takes these parameters: floating tensors all on CUDA or
    all on the CPU (torch has a fused kernel for each)."""
    params = list(params)
    types = {p.device.type for p in params}
    return (
        len(types) == 1 and types <= {"cuda", "cpu"} and all(p.is_floating_point() for p in params)
    )
