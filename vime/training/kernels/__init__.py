"""Triton kernels of the trainers, each with a torch fallback and tests against the unfused
math (forward values and gradients in fp32)."""

from __future__ import annotations

import functools
import os

import torch

# Set on a norm weight by a model builder whose gradients live in megatron's fp32 ``main_grad``
# buffers with gradient-accumulation fusion on: its kernels then add the weight's gradient
# there themselves (see :func:`norm_weight_grad`).
ACCUMULATE_MAIN_GRAD = "vime_accumulate_main_grad"


def runs_here(t: torch.Tensor) -> bool:
    """Whether a Triton kernel can take ``t`` where it lives: a non-empty CUDA tensor, or any
    non-empty tensor under Triton's interpreter (``TRITON_INTERPRET=1``, how the tests run the
    kernels on the CPU)."""
    return t.numel() > 0 and (t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def reduction_programs(device: torch.device) -> int:
    """Programs for a kernel whose programs each reduce a share of the rows into partial sums:
    four per multiprocessor on CUDA; a few under the interpreter, which still exercises the
    partial sums."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count * 4


def norm_weight_grad(weight: torch.Tensor, partial: torch.Tensor) -> torch.Tensor:
    """A norm weight's gradient from its kernel's fp32 per-program partial sums
    (``[programs, width]``, any strides): their column sums in the weight's dtype.

    For a weight marked :data:`ACCUMULATE_MAIN_GRAD` whose fp32 ``main_grad`` megatron's
    distributed wrapper keeps, the sums are added there in one GEMV (no bf16 rounding, no
    separate cast and add), and the weight is flagged ``grad_added_to_main_grad`` so megatron's
    backward hook skips the returned placeholder, as its own linears do with
    ``gradient_accumulation_fusion``.
    """
    main = getattr(weight, "main_grad", None)
    if (
        getattr(weight, ACCUMULATE_MAIN_GRAD, False)
        and main is not None
        and main.dtype == torch.float32
        and hasattr(weight, "grad_added_to_main_grad")
    ):
        main.addmv_(partial.t(), _ones(partial.shape[0], partial.device))
        weight.grad_added_to_main_grad = True
        return torch.empty_like(weight)
    return partial.sum(0).to(weight.dtype)


@functools.lru_cache(maxsize=16)
def _ones(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, dtype=torch.float32, device=device)
