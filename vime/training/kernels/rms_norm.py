"""RMSNorm forward and backward as two Triton kernels.

torch's fused ``F.rms_norm`` is fast forward, but its backward reduces the weight gradient
with a generic column-reduction kernel that is slow for the many short rows of Qwen3's
query/key norms (tokens x heads rows of 128): it took 24 of a 1.7B Megatron step's 30 ms of
norm time on an H200. Here the backward computes the input gradient row by row and the weight
gradient as per-program partial sums in registers (one ``[programs, hidden]`` fp32 buffer,
summed once at the end), reading ``x`` and ``dy`` once.

Everything is computed in fp32 whatever the storage dtype: ``y = x * rstd * w`` rounded once,
``rstd = 1 / sqrt(mean(x^2) + eps)``, the same order as ``F.rms_norm``.

:func:`rms_norm` runs the kernels on CUDA tensors (and on CPU tensors under Triton's
interpreter, ``TRITON_INTERPRET=1``, which is how the tests check them without a GPU); anything
else goes to ``F.rms_norm``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from vime.training.kernels import norm_weight_grad, reduction_programs, runs_here

# Rows wider than this are left to torch: one row must fit a program's registers.
MAX_FUSED_WIDTH = 16384
# Elements a program holds per tile (rows x padded width).
_TILE_ELEMENTS = 2048


def available(x: torch.Tensor) -> bool:
    """Whether the Triton kernels can normalise ``x`` here (CUDA, or Triton's interpreter)."""
    return x.shape[-1] <= MAX_FUSED_WIDTH and runs_here(x) and _kernels() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2, -1) + eps) * weight`` over the last dimension, in ``x``'s dtype.

    Uses the Triton kernels where :func:`available`, else ``F.rms_norm``; both give the same
    values up to fp32 rounding and the same gradients for ``x`` and ``weight``.
    """
    if weight.shape != (x.shape[-1],):
        raise ValueError(
            f"rms_norm: weight of shape {tuple(weight.shape)} for rows of {x.shape[-1]}"
        )
    if not available(x):
        return F.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps)
    return _RMSNorm.apply(x, weight, eps)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[rows, width]`` with unit column stride (a view where possible)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _block_rows(width: int) -> tuple[int, int, int]:
    """(rows per tile, padded width, warps) for rows of ``width``."""
    import triton

    block_n = triton.next_power_of_2(width)
    block_m = max(1, min(64, _TILE_ELEMENTS // block_n))
    warps = 8 if block_n >= 4096 else 4
    return block_m, block_n, warps


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        fwd, _ = _kernels()
        x2 = _rows(x)
        rows, width = x2.shape
        y = torch.empty((rows, width), dtype=x.dtype, device=x.device)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        block_m, block_n, warps = _block_rows(width)
        grid = ((rows + block_m - 1) // block_m,)
        fwd[grid](
            x2, weight, y, rstd, rows, width, x2.stride(0), eps,
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
        )  # fmt: skip
        ctx.save_for_backward(x2, weight, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        _, bwd = _kernels()
        x2, weight, rstd = ctx.saved_tensors
        rows, width = x2.shape
        dy2 = _rows(dy)
        dx = torch.empty((rows, width), dtype=x2.dtype, device=x2.device)
        block_m, block_n, warps = _block_rows(width)
        tiles = (rows + block_m - 1) // block_m
        programs = min(tiles, reduction_programs(x2.device))
        rows_per_program = ((tiles + programs - 1) // programs) * block_m
        programs = (rows + rows_per_program - 1) // rows_per_program
        partial = torch.empty((programs, width), dtype=torch.float32, device=x2.device)
        bwd[(programs,)](
            dy2, x2, weight, rstd, dx, partial, rows, width,
            dy2.stride(0), x2.stride(0), rows_per_program,
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
        )  # fmt: skip
        return dx.view(dy.shape), norm_weight_grad(weight, partial), None


@functools.cache
def _kernels() -> tuple[Any, Any] | None:
    """The forward and backward Triton kernels, or None without Triton."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def forward(
        X, W, Y, RSTD, rows, width, stride_x, eps,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        row = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        col = tl.arange(0, BLOCK_N)
        row_ok = row < rows
        col_ok = col < width
        ok = row_ok[:, None] & col_ok[None, :]
        x = tl.load(X + row[:, None] * stride_x + col[None, :], mask=ok, other=0.0)
        x = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / width + eps)
        w = tl.load(W + col, mask=col_ok, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(Y + row[:, None] * width + col[None, :], y.to(Y.dtype.element_ty), mask=ok)
        tl.store(RSTD + row, rstd, mask=row_ok)

    @triton.jit
    def backward(
        DY, X, W, RSTD, DX, DW_PARTIAL, rows, width, stride_dy, stride_x, rows_per_program,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        col = tl.arange(0, BLOCK_N)
        col_ok = col < width
        w = tl.load(W + col, mask=col_ok, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK_N], dtype=tl.float32)
        first = pid.to(tl.int64) * rows_per_program
        for start in range(0, rows_per_program, BLOCK_M):
            row = first + start + tl.arange(0, BLOCK_M)
            row_ok = row < rows
            ok = row_ok[:, None] & col_ok[None, :]
            x = tl.load(X + row[:, None] * stride_x + col[None, :], mask=ok, other=0.0)
            dy = tl.load(DY + row[:, None] * stride_dy + col[None, :], mask=ok, other=0.0)
            x, dy = x.to(tl.float32), dy.to(tl.float32)
            rstd = tl.load(RSTD + row, mask=row_ok, other=0.0)
            xhat = x * rstd[:, None]
            wdy = dy * w[None, :]
            c = tl.sum(xhat * wdy, axis=1) / width
            dx = (wdy - xhat * c[:, None]) * rstd[:, None]
            tl.store(DX + row[:, None] * width + col[None, :], dx.to(DX.dtype.element_ty), mask=ok)
            dw += tl.sum(dy * xhat, axis=0)
        tl.store(DW_PARTIAL + pid * width + col, dw, mask=col_ok)

    return forward, backward
