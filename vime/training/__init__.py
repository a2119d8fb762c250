"""Trainer backends (torch, megatron) behind one interface; see :class:`~vime.training.base.Trainer`."""

from __future__ import annotations

import importlib
from typing import Any

from vime.errors import ConfigError
from vime.training.base import Trainer, TrainerConfig
from vime.training.batch import TrainBatch, TrainSample

# Backends load by dotted path so neither torch nor megatron is imported before it is chosen.
BACKENDS: dict[str, str] = {
    "torch": "vime.training.torch_backend:TorchTrainer",
    "megatron": "vime.training.megatron:MegatronTrainer",
}


def create_trainer(config: TrainerConfig, **kwargs: Any) -> Trainer:
    """Build the backend ``config.backend`` names; ``kwargs`` go to its constructor."""
    if config.backend not in BACKENDS:
        raise ConfigError(
            f"--backend {config.backend!r} is unknown; choose one of {sorted(BACKENDS)}"
        )
    module, name = BACKENDS[config.backend].split(":")
    return getattr(importlib.import_module(module), name)(config, **kwargs)


__all__ = ["BACKENDS", "TrainBatch", "TrainSample", "Trainer", "TrainerConfig", "create_trainer"]
