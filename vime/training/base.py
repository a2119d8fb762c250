"""The trainer interface shared by the torch and Megatron backends, and its typed config.

Flag names follow Megatron's own (``--lr``, ``--clip-grad``, ``--adam-beta1``...), so one flag
means the same thing whichever backend runs.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from vime.config.schema import option
from vime.errors import ConfigError
from vime.training.buckets import DEFAULT_BUCKET_BYTES

if TYPE_CHECKING:
    import torch

    from vime.training.batch import TrainBatch


@dataclass
class TrainerConfig:
    """Trainer options (model, optimizer, schedule, micro-batching, precision)."""

    hf_checkpoint: str = option("", help="HF model folder the trainer loads (config + weights)")
    backend: Literal["torch", "megatron"] = option("torch", help="trainer implementation")
    lr: float = option(1e-6, help="peak learning rate of AdamW")
    min_lr: float = option(0.0, help="learning rate at the end of a cosine or linear decay")
    lr_warmup_iters: int = option(0, help="steps of linear warmup from 0 to --lr")
    lr_decay_style: Literal["constant", "linear", "cosine"] = option(
        "constant", help="learning-rate schedule after warmup"
    )
    train_iters: int | None = option(
        None, help="total optimizer steps; needed by the linear and cosine schedules"
    )
    weight_decay: float = option(0.0, help="AdamW decoupled weight decay")
    adam_beta1: float = option(0.9, help="AdamW beta1")
    adam_beta2: float = option(0.999, help="AdamW beta2")
    adam_eps: float = option(1e-8, help="AdamW epsilon")
    clip_grad: float = option(1.0, help="clip the global gradient norm to this (0 disables)")
    max_tokens_per_micro_batch: int = option(
        8192, help="token budget of one packed micro-batch (per process)"
    )
    dtype: Literal["auto", "float32", "bfloat16"] = option(
        "auto", help="parameter dtype; auto means float32 on CPU and bfloat16 on GPU"
    )
    attn_implementation: str = option("sdpa", help="transformers attention implementation")
    gradient_checkpointing: bool = option(False, help="recompute activations in the backward")
    rollout_temperature: float = option(
        1.0, help="sampling temperature of the rollouts; logits are divided by it"
    )
    seed: int = option(1234, help="seed of the trainer's random number generators")

    def __post_init__(self) -> None:
        checks = [
            (self.lr >= 0, "--lr", self.lr, "must be >= 0"),
            (0 <= self.min_lr <= self.lr, "--min-lr", self.min_lr, "must be in [0, --lr]"),
            (self.lr_warmup_iters >= 0, "--lr-warmup-iters", self.lr_warmup_iters, "must be >= 0"),
            (self.weight_decay >= 0, "--weight-decay", self.weight_decay, "must be >= 0"),
            (0 <= self.adam_beta1 < 1, "--adam-beta1", self.adam_beta1, "must be in [0, 1)"),
            (0 <= self.adam_beta2 < 1, "--adam-beta2", self.adam_beta2, "must be in [0, 1)"),
            (self.adam_eps > 0, "--adam-eps", self.adam_eps, "must be > 0"),
            (self.clip_grad >= 0, "--clip-grad", self.clip_grad, "must be >= 0 (0 disables)"),
            (
                self.max_tokens_per_micro_batch > 0,
                "--max-tokens-per-micro-batch",
                self.max_tokens_per_micro_batch,
                "must be > 0",
            ),
            (
                self.rollout_temperature > 0,
                "--rollout-temperature",
                self.rollout_temperature,
                "must be > 0",
            ),
        ]
        for ok, flag, value, what in checks:
            if not ok:
                raise ConfigError(f"{flag} {value!r} {what}")
        decays = self.lr_decay_style != "constant"
        if decays and (self.train_iters is None or self.train_iters <= self.lr_warmup_iters):
            raise ConfigError(
                f"--lr-decay-style {self.lr_decay_style} needs --train-iters greater than "
                f"--lr-warmup-iters ({self.lr_warmup_iters}), got {self.train_iters!r}"
            )


class Trainer(abc.ABC):
    """A policy being trained: logprobs, optimizer steps, weight export and checkpoints.

    Every method is collective when the trainer runs in several processes: each rank calls it
    with the same global batch and the backend shares the work out. ``weight_version`` starts
    at 0 for the loaded weights and grows by one with every optimizer step.
    """

    config: TrainerConfig
    rank: int = 0  # this process's rank in the trainer's process group
    world_size: int = 1

    @property
    @abc.abstractmethod
    def weight_version(self) -> int:
        """Number of optimizer steps applied to the loaded weights (restored by ``load``)."""

    @abc.abstractmethod
    def compute_logprobs(self, batch: TrainBatch) -> list[torch.Tensor]:
        """The current policy's logprobs: one float32 CPU tensor per sample, in batch order.

        Each has the sample's length; entry ``i`` is log p(token_ids[i] | token_ids[:i]) and
        entry 0 is 0.0. Every rank gets the whole list.
        """

    @abc.abstractmethod
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step on the whole batch (micro-batched); returns metrics.

        Metrics include at least ``loss``, ``grad_norm``, ``lr`` and ``tokens_per_s``.
        """

    def step_logprobs(self) -> list[torch.Tensor]:
        """Per-token logprobs of the last ``train_step``'s samples under the weights before its
        update (what the loss compared with the rollout's), in batch order; collective like
        ``compute_logprobs``. Empty when the backend does not keep them."""
        return []

    @abc.abstractmethod
    def export_weights(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full weights under their HF checkpoint names, in buckets of about ``bucket_bytes``.

        Collective: every rank must exhaust the iterator; rank 0 receives the buckets (full,
        unsharded tensors), the other ranks receive none.
        """

    @abc.abstractmethod
    def save(self, directory: str | Path) -> Path:
        """Write a checkpoint (model, optimizer, scheduler, RNG, version) atomically."""

    @abc.abstractmethod
    def load(self, directory: str | Path) -> None:
        """Restore everything ``save`` wrote; raises ``CheckpointError`` when it cannot."""

    def save_hf(self, directory: str | Path, *, max_shard_bytes: int = 2 << 30) -> Path:
        """Write the current weights as an HF model folder (collective; rank 0 writes).

        Safetensors shards under the HF names of :meth:`export_weights`, plus the config and
        tokenizer files of ``config.hf_checkpoint``; engines can reload weights from it.
        """
        from vime.training.hf_export import save_hf_checkpoint

        return save_hf_checkpoint(self, directory, max_shard_bytes=max_shard_bytes)

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing to free
        """Release processes or memory the backend holds."""
