"""Multi-tensor kernels for megatron-core's optimizer without Apex or TransformerEngine.

megatron-core computes the gradient norm and scales (clips) or copies parameter lists through
``multi_tensor_applier(l2_norm_impl | multi_tensor_scale_impl, ...)``. Without Apex/TE it falls
back to per-tensor Python loops: the L2 norm reads each parameter's norm back to the host
(one device sync per parameter: 291 per step for Qwen3-4B) and the scale writes
``dst.copy_(src * scale)`` per tensor (a temporary and two passes over the fp32 gradients).
The versions here are torch ``_foreach`` kernels with no host sync; the results are the same
up to the order of a floating-point sum. :func:`install` swaps them in only where megatron-core
chose its local fallbacks.
"""

from __future__ import annotations

from typing import Any

import torch


def foreach_l2_norm(
    chunk_size: int,
    noop_flag: Any,
    tensor_lists: list[list[torch.Tensor]],
    per_tensor: bool,
    *_: Any,
) -> tuple[torch.Tensor, None]:
    """The L2 norm over every tensor of ``tensor_lists[0]``, as a one-element fp32 tensor on
    their device (the contract of megatron-core's ``l2_norm_impl``; per-tensor norms are not
    returned, as in its local fallback)."""
    tensors = tensor_lists[0]
    if not tensors:
        return torch.zeros(1, dtype=torch.float32), None
    norms = torch._foreach_norm(tensors)
    total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))
    return total.reshape(1), None


def foreach_scale(
    chunk_size: int, noop_flag: Any, tensor_lists: list[list[torch.Tensor]], scale: float
) -> None:
    """``dst = src * scale`` for each pair of ``tensor_lists = [src, dst]`` (megatron-core's
    ``multi_tensor_scale_impl``): in place when the lists are the same tensors (gradient
    clipping), a plain copy when ``scale`` is 1 (parameter copies)."""
    src, dst = tensor_lists
    if len(src) != len(dst):
        raise ValueError(f"multi-tensor scale: {len(src)} sources for {len(dst)} destinations")
    if not src:
        return
    if all(a is b for a, b in zip(src, dst, strict=True)):
        torch._foreach_mul_(dst, scale)
    elif scale == 1.0:
        torch._foreach_copy_(dst, src)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, scale))


def install() -> None:
    """Use the kernels above where megatron-core fell back to its per-tensor loops
    (idempotent; Apex or TE kernels, when present, are left in place)."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    if clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = foreach_l2_norm
    for module in (clip_grads, optimizer):
        if module.multi_tensor_scale_impl is utils.local_multi_tensor_scale:
            module.multi_tensor_scale_impl = foreach_scale
