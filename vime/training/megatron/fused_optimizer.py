"""Megatron's optimizer step through one Triton kernel per parameter group
(``--optimizer-fusion``, on with CUDA): gradient clipping, AdamW on the fp32 masters and the
bf16 model copy in one pass (vime.training.optim.fused_adamw_step), instead of megatron-core's
three.

The states stay where megatron-core and torch keep them: the masters in megatron's
``Float16OptimizerWithFloat16Params``, the moments and step counts in torch's AdamW ``state``,
so checkpoints and the unfused step read and write the same tensors. Only the non-distributed
optimizer is covered (its masters are whole parameters); the config refuses the flag with
``--use-distributed-optimizer``.
"""

from __future__ import annotations

from typing import Any

import torch

from vime.training.optim import fused_adamw_step


def optimizer_parts(optimizer: Any) -> list[Any]:
    """The optimizers a megatron ``ChainedOptimizer`` holds (or the optimizer itself)."""
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def check_supported(optimizer: Any) -> None:
    """Raise a ``TypeError`` naming what the fused step cannot take."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for part in optimizer_parts(optimizer):
        if isinstance(part, DistributedOptimizer):
            raise TypeError("the fused optimizer step does not cover the distributed optimizer")
        inner = part.optimizer
        if not isinstance(inner, torch.optim.AdamW):
            raise TypeError(f"the fused optimizer step is AdamW; megatron built {type(inner)}")
        for group in inner.param_groups:
            if group.get("amsgrad") or group.get("maximize"):
                raise TypeError("the fused optimizer step has no amsgrad or maximize")
        if getattr(part, "grad_scaler", None) is not None:
            raise TypeError("the fused optimizer step has no loss scaling (use --bf16)")


@torch.no_grad()
def fused_step(optimizer: Any) -> tuple[bool, float | torch.Tensor]:
    """One optimizer step of a megatron optimizer (single or chained) with the fused kernel;
    returns (success, the gradient norm before clipping) as megatron's ``step()`` does: the
    norm is 0.0 when clipping is off, as there.

    The norm and the clipping factor stay on the device (the norm a float64 scalar tensor):
    megatron-core reads the norm back to the host first, and the GPU then idled while the host
    launched the update. The caller reads the norm once the step's work is queued."""
    parts = optimizer_parts(optimizer)
    if optimizer.prepare_grads():  # main grads in place; True only on a found inf/nan
        return False, 0.0
    clip = parts[0].config.clip_grad
    grad_norm: float | torch.Tensor = 0.0
    if clip > 0.0 or len(parts) > 1:
        grad_norm = device_grad_norm(optimizer)
    scale: float | torch.Tensor = 1.0
    if clip > 0.0:  # megatron-core's rule and epsilon, in float64 as its host math is
        scale = (clip / (grad_norm + 1.0e-6)).clamp(max=1.0).float().reshape(1)
    for part in parts:
        _step_part(part, scale)
    return True, grad_norm


def device_grad_norm(optimizer: Any) -> torch.Tensor:
    """The gradient norm megatron-core's ``get_grad_norm`` computes (same gradients, same
    process groups, same kernel), as a float64 scalar tensor on the device instead of a
    host float: the L2 norm's square summed over each statistics group, then its root."""
    from megatron.core.optimizer import clip_grads
    from megatron.core.utils import to_local_if_dtensor

    parts = optimizer_parts(optimizer)
    shared = len({id(p.get_grad_stats_parallel_group()) for p in parts}) == 1
    roots = []
    for members in [parts] if shared else [[p] for p in parts]:
        grads = [to_local_if_dtensor(g) for p in members for g in p.get_main_grads_for_grad_norm()]
        if grads:
            norm, _ = clip_grads.multi_tensor_applier(
                clip_grads.l2_norm_impl, _no_overflow(grads[0].device), [grads], False
            )
            square = norm.float() ** 2
        else:
            device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
            square = torch.zeros(1, dtype=torch.float32, device=device)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(
                square, op=torch.distributed.ReduceOp.SUM,
                group=members[0].get_grad_stats_parallel_group(),
            )  # fmt: skip
        roots.append(square.double().sqrt().reshape(()))  # megatron's host math is float64
    if len(roots) == 1:
        return roots[0]
    return torch.stack([r * r for r in roots]).sum().sqrt()  # megatron's chained rule


def _no_overflow(device: torch.device) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.int, device=device)


def _step_part(part: Any, grad_scale: float | torch.Tensor) -> None:
    # megatron's FP32Optimizer (no --bf16) has no copies: its params are the masters
    model_of = {
        id(main): model.data
        for models, mains in zip(
            getattr(part, "float16_groups", []),
            getattr(part, "fp32_from_float16_groups", []),
            strict=True,
        )
        for model, main in zip(models, mains, strict=True)
    }
    fused_adamw_step(part.optimizer, model_of, grad_scale)
