"""SwiGLU, ``silu(a) * b`` of the two halves ``[a, b]`` of the last dimension, and its gradient,
as Triton kernels.

They take the place of megatron-core's ``torch.compile``'d ``swiglu``/``swiglu_back`` (its fused
MLP activation) on CUDA: the same math in fp32, rounded once, without the compiled wrapper's
host time per call. Elsewhere the functions hand over to the compiled ones.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from vime.training.kernels import runs_here

_BLOCK = 1024


def available(y: torch.Tensor) -> bool:
    """Whether the kernels can take ``y`` here (CUDA, or Triton's interpreter)."""
    return y.shape[-1] % 2 == 0 and runs_here(y) and _kernels() is not None


def swiglu(y: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` for ``y = [a, b]`` split in halves of the last dimension."""
    y2 = y.reshape(-1, y.shape[-1]).contiguous()
    rows, width = y2.shape
    out = torch.empty((rows, width // 2), dtype=y.dtype, device=y.device)
    _launch(0, y2, None, out)
    return out.view(*y.shape[:-1], width // 2)


def swiglu_back(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`swiglu` at ``y`` for the output gradient ``g``:
    ``[g b silu'(a), g silu(a)]``."""
    y2 = y.reshape(-1, y.shape[-1]).contiguous()
    g2 = g.reshape(-1, g.shape[-1]).contiguous()
    out = torch.empty_like(y2)
    _launch(1, y2, g2, out)
    return out.view(y.shape)


def _launch(backward: int, y: torch.Tensor, g: torch.Tensor | None, out: torch.Tensor) -> None:
    rows, width = y.shape
    half = width // 2
    grid = (rows, (half + _BLOCK - 1) // _BLOCK)
    _kernels()[grid](y, g if g is not None else y, out, half, BACKWARD=backward, BLOCK=_BLOCK)


def dispatching(
    kernel: Callable[..., torch.Tensor], fallback: Callable[..., torch.Tensor]
) -> Callable[..., torch.Tensor]:
    """``kernel`` where :func:`available` for the last argument (``y``), else ``fallback``."""

    @functools.wraps(fallback)
    def call(*args: torch.Tensor) -> torch.Tensor:
        return kernel(*args) if available(args[-1]) else fallback(*args)

    call.vime_fallback = fallback  # type: ignore[attr-defined]
    return call


def gated_silu(y: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` for ``y = [a, b]`` with autograd (a fused gate/up projection's output):
    :func:`swiglu` forward and :func:`swiglu_back` backward where Triton runs, saving only
    ``y``; the same math in torch elsewhere."""
    if not available(y):
        a, b = y.chunk(2, dim=-1)
        return torch.nn.functional.silu(a) * b
    return _GatedSilu.apply(y)


class _GatedSilu(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(y)
        return swiglu(y)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return swiglu_back(g, y)


def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` for two tensors of one shape and dtype (transformers' gated MLP keeps
    the gate and up projections apart): one kernel each way where Triton runs, saving only
    ``a`` and ``b`` for backward; ``F.silu(a) * b`` elsewhere."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"silu_mul: a and b differ: {a.dtype} {tuple(a.shape)} and "
                         f"{b.dtype} {tuple(b.shape)}")  # fmt: skip
    if not (runs_here(a) and _pair_kernel() is not None):
        return torch.nn.functional.silu(a) * b
    return _SiluMul.apply(a, b)


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.contiguous(), b.contiguous()
        out = torch.empty_like(a)
        _launch_pair(0, a, b, None, out, None)
        ctx.save_for_backward(a, b)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        da, db = torch.empty_like(a), torch.empty_like(b)
        _launch_pair(1, a, b, g.contiguous(), da, db)
        return da, db


def _launch_pair(
    backward: int,
    a: torch.Tensor,
    b: torch.Tensor,
    g: torch.Tensor | None,
    out: torch.Tensor,
    db: torch.Tensor | None,
) -> None:
    n = a.numel()
    grid = ((n + _BLOCK - 1) // _BLOCK,)
    _pair_kernel()[grid](a, b, g if g is not None else a, out, db if db is not None else out, n,
                         BACKWARD=backward, BLOCK=_BLOCK)  # fmt: skip


@functools.cache
def _pair_kernel() -> Any:
    """The two-tensor kernel (forward or backward by a constexpr), or None without Triton."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def kernel(A, B, G, OUT, DB, n, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        a = tl.load(A + offs, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(B + offs, mask=ok, other=0.0).to(tl.float32)
        sig = 1.0 / (1.0 + tl.exp(-a))
        silu = a * sig
        dt = OUT.dtype.element_ty
        if BACKWARD:
            g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
            tl.store(OUT + offs, (g * b * sig * (1.0 + a * (1.0 - sig))).to(dt), mask=ok)
            tl.store(DB + offs, (g * silu).to(dt), mask=ok)
        else:
            tl.store(OUT + offs, (silu * b).to(dt), mask=ok)

    return kernel


@functools.cache
def _kernels() -> Any:
    """The Triton kernel (forward or backward by a constexpr), or None without Triton."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def kernel(Y, G, OUT, half, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = col < half
        a = tl.load(Y + row * 2 * half + col, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(Y + row * 2 * half + half + col, mask=ok, other=0.0).to(tl.float32)
        sig = 1.0 / (1.0 + tl.exp(-a))
        silu = a * sig
        dt = OUT.dtype.element_ty
        if BACKWARD:
            g = tl.load(G + row * half + col, mask=ok, other=0.0).to(tl.float32)
            da = g * b * sig * (1.0 + a * (1.0 - sig))
            tl.store(OUT + row * 2 * half + col, da.to(dt), mask=ok)
            tl.store(OUT + row * 2 * half + half + col, (g * silu).to(dt), mask=ok)
        else:
            tl.store(OUT + row * half + col, (silu * b).to(dt), mask=ok)

    return kernel
