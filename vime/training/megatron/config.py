"""Megatron's own flags (TP/PP/DP/EP layout, distributed optimizer, precision, recompute, MoE
aux loss, fusions), typed.

They arrive as passthrough arguments, spelled as Megatron spells them
(``--tensor-model-parallel-size 2 --use-distributed-optimizer --bf16``), and are parsed once
into a :class:`MegatronConfig`; an unknown or contradictory flag is a ``ConfigError`` naming it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from vime.errors import ConfigError

Role = Literal["actor", "reference"]


@dataclass(frozen=True)
class MegatronConfig:
    """Parallel layout and Megatron-specific training options."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    use_distributed_optimizer: bool = False
    bf16: bool = False
    recompute_granularity: Literal["full", "selective"] | None = None
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: int | None = None
    overlap_grad_reduce: bool = False
    expert_model_parallel_size: int = 1
    moe_aux_loss_coeff: float = 0.0
    # Fusions; None means on with CUDA, off on the CPU (where compiling costs more than it
    # saves on tiny models). SwiGLU: megatron-core's fused function, its math in Triton kernels
    # on CUDA; RoPE and weight-gradient accumulation: vime.training.megatron.fusions; RMSNorm:
    # Triton kernels (vime.training.kernels.rms_norm) instead of F.rms_norm; optimizer: clipping,
    # AdamW and the bf16 model copy in one Triton pass (vime.training.megatron.fused_optimizer),
    # not with the distributed optimizer; query/key norms and RoPE: one Triton kernel each way
    # straight from the QKV projection (vime.training.megatron.qk_fusion), on by default where
    # both the RMSNorm and the RoPE fusions are.
    bias_swiglu_fusion: bool | None = None
    apply_rope_fusion: bool | None = None
    gradient_accumulation_fusion: bool | None = None
    rms_norm_fusion: bool | None = None
    optimizer_fusion: bool | None = None
    qk_norm_rope_fusion: bool | None = None

    def fused(
        self,
        name: Literal[
            "bias_swiglu",
            "apply_rope",
            "gradient_accumulation",
            "rms_norm",
            "optimizer",
            "qk_norm_rope",
        ],
    ) -> bool:
        """Whether the ``name`` fusion is on: its flag, else on with CUDA (the optimizer's only
        without the distributed optimizer; the query/key one where the RMSNorm and RoPE ones
        are)."""
        value = getattr(self, f"{name}_fusion")
        if value is not None:
            return bool(value)
        if name == "optimizer" and self.use_distributed_optimizer:
            return False
        if name == "qk_norm_rope":
            return self.fused("rms_norm") and self.fused("apply_rope")
        import torch

        return torch.cuda.is_available()

    def __post_init__(self) -> None:
        if self.expert_model_parallel_size < 1:
            raise ConfigError(
                f"--expert-model-parallel-size {self.expert_model_parallel_size} must be >= 1"
            )
        if self.moe_aux_loss_coeff < 0:
            raise ConfigError(f"--moe-aux-loss-coeff {self.moe_aux_loss_coeff} must be >= 0")
        if self.optimizer_fusion and self.use_distributed_optimizer:
            raise ConfigError(
                "--optimizer-fusion covers the non-distributed optimizer only; drop it or "
                "--use-distributed-optimizer"
            )
        if self.qk_norm_rope_fusion and False in (self.rms_norm_fusion, self.apply_rope_fusion):
            raise ConfigError(
                "--qk-norm-rope-fusion runs the query/key norms and RoPE in one kernel; it "
                "contradicts --no-rms-norm-fusion and --no-rope-fusion"
            )
        if self.tensor_model_parallel_size < 1:
            raise ConfigError(
                f"--tensor-model-parallel-size {self.tensor_model_parallel_size} must be >= 1"
            )
        if self.pipeline_model_parallel_size < 1:
            raise ConfigError(
                f"--pipeline-model-parallel-size {self.pipeline_model_parallel_size} must be >= 1"
            )
        if self.recompute_granularity == "full":
            if self.recompute_method is None or not self.recompute_num_layers:
                raise ConfigError(
                    "--recompute-granularity full needs --recompute-method (uniform or block) "
                    "and --recompute-num-layers N"
                )
        elif self.recompute_method is not None or self.recompute_num_layers is not None:
            raise ConfigError(
                "--recompute-method/--recompute-num-layers apply only with "
                "--recompute-granularity full"
            )

    def data_parallel_size(self, world_size: int) -> int:
        """Data-parallel ranks of a ``world_size``-process job; raises when it does not divide."""
        per_replica = self.tensor_model_parallel_size * self.pipeline_model_parallel_size
        if world_size % per_replica:
            raise ConfigError(
                f"{world_size} processes cannot be split into model replicas of "
                f"--tensor-model-parallel-size {self.tensor_model_parallel_size} x "
                f"--pipeline-model-parallel-size {self.pipeline_model_parallel_size}"
            )
        dp = world_size // per_replica
        ep = self.expert_model_parallel_size
        if (dp * self.tensor_model_parallel_size) % ep:
            raise ConfigError(
                f"--expert-model-parallel-size {ep} must divide the "
                f"{dp * self.tensor_model_parallel_size} ranks of a pipeline stage "
                f"({world_size} processes / --pipeline-model-parallel-size "
                f"{self.pipeline_model_parallel_size})"
            )
        return dp


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"Megatron flags: {message}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="megatron flags", add_help=False, allow_abbrev=False)
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--use-distributed-optimizer", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--recompute-granularity", choices=["full", "selective"])
    p.add_argument("--recompute-method", choices=["uniform", "block"])
    p.add_argument("--recompute-num-layers", type=int)
    p.add_argument("--recompute-activations", action="store_true")
    p.add_argument("--overlap-grad-reduce", action="store_true")
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--context-parallel-size", type=int, default=1)
    p.add_argument("--expert-model-parallel-size", type=int, default=1)
    p.add_argument("--moe-aux-loss-coeff", type=float, default=0.0)
    fusions = (
        "bias-swiglu",
        "rope",
        "gradient-accumulation",
        "rms-norm",
        "optimizer",
        "qk-norm-rope",
    )
    for name in fusions:
        dest = "apply_rope_fusion" if name == "rope" else f"{name.replace('-', '_')}_fusion"
        flag = "apply-rope" if name == "rope" else name
        p.add_argument(f"--{flag}-fusion", dest=dest, action="store_true", default=None)
        p.add_argument(f"--no-{name}-fusion", dest=dest, action="store_false")
    return p


def parse_megatron_args(args: Sequence[str]) -> MegatronConfig:
    """Parse Megatron's flags; raises ``ConfigError`` naming an unknown or unsupported one."""
    known, unknown = _parser().parse_known_args(list(args))
    if unknown:
        raise ConfigError(
            f"unrecognized Megatron flag {unknown[0]!r}; the Megatron backend accepts "
            "--tensor-model-parallel-size, --pipeline-model-parallel-size, "
            "--use-distributed-optimizer, --bf16, --recompute-granularity, --recompute-method, "
            "--recompute-num-layers, --recompute-activations, --overlap-grad-reduce, "
            "--expert-model-parallel-size, --moe-aux-loss-coeff, --[no-]bias-swiglu-fusion, "
            "--apply-rope-fusion/--no-rope-fusion, --[no-]gradient-accumulation-fusion, "
            "--[no-]rms-norm-fusion, --[no-]optimizer-fusion, --[no-]qk-norm-rope-fusion"
        )
    if known.fp16:
        raise ConfigError("--fp16 is not supported by the Megatron backend; use --bf16")
    if known.sequence_parallel:
        raise ConfigError(
            "--sequence-parallel needs TransformerEngine-style fused norms, which this backend "
            "does not use; drop the flag"
        )
    if known.context_parallel_size != 1:
        raise ConfigError(
            f"--context-parallel-size {known.context_parallel_size} is not supported (only 1)"
        )
    granularity = known.recompute_granularity
    if known.recompute_activations:
        if granularity not in (None, "selective"):
            raise ConfigError("--recompute-activations contradicts --recompute-granularity full")
        granularity = "selective"
    return MegatronConfig(
        tensor_model_parallel_size=known.tensor_model_parallel_size,
        pipeline_model_parallel_size=known.pipeline_model_parallel_size,
        use_distributed_optimizer=known.use_distributed_optimizer,
        bf16=known.bf16,
        recompute_granularity=granularity,
        recompute_method=known.recompute_method,
        recompute_num_layers=known.recompute_num_layers,
        overlap_grad_reduce=known.overlap_grad_reduce,
        expert_model_parallel_size=known.expert_model_parallel_size,
        moe_aux_loss_coeff=known.moe_aux_loss_coeff,
        bias_swiglu_fusion=known.bias_swiglu_fusion,
        apply_rope_fusion=known.apply_rope_fusion,
        gradient_accumulation_fusion=known.gradient_accumulation_fusion,
        rms_norm_fusion=known.rms_norm_fusion,
        optimizer_fusion=known.optimizer_fusion,
        qk_norm_rope_fusion=known.qk_norm_rope_fusion,
    )
