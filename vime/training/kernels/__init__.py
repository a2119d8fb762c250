"""Triton kernels of the trainers, each with a torch fallback and tests against the unfused
math (forward values and gradients in fp32)."""

from __future__ import annotations

import os

import torch


def runs_here(t: torch.Tensor) -> bool:
    """Whether a Triton kernel can take ``t`` where it lives: a non-empty CUDA tensor, or any
    non-empty tensor under Triton's interpreter (``TRITON_INTERPRET=1``, how the tests run the
    kernels on the CPU)."""
    return t.numel() > 0 and (t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")
