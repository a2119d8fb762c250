"""Rotary position embedding (non-interleaved halves) as one Triton kernel each way.

Megatron applies RoPE to the query and the key of every layer, each call a handful of
elementwise kernels (or one ``torch.compile``'d kernel whose Python wrapper costs more host
time than the kernel takes on the GPU: a 1.7B step on an H200 waits on the host). Here one
launch computes ``cos``/``sin`` of the angles in fp32, rounds them to the input's dtype (as
megatron-core's unfused code does), and rotates every head of a token; backward applies the
transposed rotation with the same launch.

For the rotated width ``r`` split into halves ``t1, t2`` and the angles' halves ``c1, c2``
(cosines) and ``s1, s2`` (sines): ``out = [t1 c1 - t2 s1, t2 c2 + t1 s2]``; the columns past
``r`` pass through unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from vime.training.kernels import runs_here


def available(t: torch.Tensor) -> bool:
    """Whether the kernel can rotate ``t`` here (CUDA, or Triton's interpreter)."""
    return runs_here(t) and _kernel() is not None


def rotate(t: torch.Tensor, angles: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    """RoPE of ``t`` (``[tokens, heads, dim]``) by ``angles`` (``[P, rot]``, fp32).

    Token ``i`` takes row ``positions[i]`` of ``angles`` (``[tokens]`` integers), or row ``i``
    when ``positions`` is None. Returns a new contiguous ``[tokens, heads, dim]`` tensor.
    """
    if t.dim() != 3 or angles.dim() != 2:
        raise ValueError(
            f"rope: t [tokens, heads, dim] and angles [P, rot], got {t.shape}, {angles.shape}"
        )
    rot = angles.shape[1]
    if rot % 2 or rot > t.shape[-1]:
        raise ValueError(f"rope: rotary width {rot} must be even and at most {t.shape[-1]}")
    return _Rope.apply(t, angles, positions)


def _launch(
    src: torch.Tensor, angles: torch.Tensor, positions: Any, backward: bool
) -> torch.Tensor:
    import triton

    if src.stride(-1) != 1:
        src = src.contiguous()
    tokens, heads, dim = src.shape
    rot = angles.shape[1]
    out = torch.empty((tokens, heads, dim), dtype=src.dtype, device=src.device)
    block_h = triton.next_power_of_2(heads)
    _kernel()[(tokens,)](
        src, out, angles, positions if positions is not None else angles,
        src.stride(0), src.stride(1), angles.stride(0), heads, dim, rot // 2,
        HAS_POSITIONS=positions is not None,
        BACKWARD=backward,
        BLOCK_H=block_h,
        BLOCK_HALF=triton.next_power_of_2(rot // 2),
        BLOCK_PASS=triton.next_power_of_2(max(dim - rot, 1)),
        HAS_PASS=dim > rot,
        num_warps=4,
    )  # fmt: skip
    return out


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, angles: torch.Tensor, positions: Any) -> torch.Tensor:
        ctx.save_for_backward(angles, positions)
        return _launch(t, angles, positions, backward=False)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        angles, positions = ctx.saved_tensors
        return _launch(grad, angles, positions, backward=True), None, None


def rotate_with_tables(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of ``t`` (``[tokens, heads, dim]``, any strides with a unit last one) by given
    ``cos``/``sin`` tables (``[tokens, dim]``, one row per token, as transformers' rotary
    embedding computes them): ``t * cos + rotate_half(t) * sin`` in fp32, rounded once to
    ``t``'s dtype. Returns a new contiguous ``[tokens, heads, dim]`` tensor."""
    if t.dim() != 3 or cos.shape != (t.shape[0], t.shape[2]) or sin.shape != cos.shape:
        raise ValueError(f"rope: t [tokens, heads, dim] and cos/sin [tokens, dim] expected, got "
                         f"{tuple(t.shape)}, {tuple(cos.shape)}, {tuple(sin.shape)}")  # fmt: skip
    if t.shape[2] % 2:
        raise ValueError(f"rope: head width {t.shape[2]} must be even")
    return _RopeTables.apply(t, cos, sin)


class _RopeTables(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cos, sin = cos.contiguous(), sin.contiguous()
        ctx.save_for_backward(cos, sin)
        return _launch_tables(t, cos, sin, backward=False)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _launch_tables(grad, cos, sin, backward=True), None, None


def _launch_tables(
    src: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool
) -> torch.Tensor:
    import triton

    if src.stride(-1) != 1:
        src = src.contiguous()
    tokens, heads, dim = src.shape
    out = torch.empty((tokens, heads, dim), dtype=src.dtype, device=src.device)
    _tables_kernel()[(tokens,)](
        src, out, cos, sin, src.stride(0), src.stride(1), heads, dim // 2,
        BACKWARD=backward, BLOCK_H=triton.next_power_of_2(heads),
        BLOCK_HALF=triton.next_power_of_2(dim // 2), num_warps=4,
    )  # fmt: skip
    return out


try:
    import triton as _triton
    import triton.language as _tl  # noqa: F401 - Triton's interpreter looks for it here
except ImportError:  # pragma: no cover - torch wheels for CUDA ship Triton
    _triton = None

if _triton is not None:

    @_triton.jit
    def _rotate_halves(x1, x2, c1, c2, s1, s2, BACKWARD: _triton.language.constexpr):
        """The rotation of one pair of halves, shared by both kernels (inlined by Triton)."""
        if BACKWARD:  # the transposed rotation
            return x1 * c1 + x2 * s2, x2 * c2 - x1 * s1
        return x1 * c1 - x2 * s1, x2 * c2 + x1 * s2


@functools.cache
def _tables_kernel() -> Any:
    """The table-driven Triton kernel, or None without Triton."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def rope_tables(
        T, OUT, COS, SIN, stride_tok, stride_head, heads, half,
        BACKWARD: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    ):  # fmt: skip
        tok = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, BLOCK_HALF)
        j_ok = j < half
        row = tok * 2 * half
        c1 = tl.load(COS + row + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
        c2 = tl.load(COS + row + half + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
        s1 = tl.load(SIN + row + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
        s2 = tl.load(SIN + row + half + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
        h = tl.arange(0, BLOCK_H)
        ok = (h < heads)[:, None] & j_ok[None, :]
        src = T + tok * stride_tok + h[:, None] * stride_head
        dst = OUT + tok * heads * 2 * half + h[:, None] * 2 * half
        x1 = tl.load(src + j[None, :], mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(src + half + j[None, :], mask=ok, other=0.0).to(tl.float32)
        y1, y2 = _rotate_halves(x1, x2, c1, c2, s1, s2, BACKWARD)
        dt = OUT.dtype.element_ty
        tl.store(dst + j[None, :], y1.to(dt), mask=ok)
        tl.store(dst + half + j[None, :], y2.to(dt), mask=ok)

    return rope_tables


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, or None without Triton."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def rope(
        T, OUT, ANGLES, POSITIONS, stride_tok, stride_head, stride_angles, heads, dim, half,
        HAS_POSITIONS: tl.constexpr, BACKWARD: tl.constexpr, BLOCK_H: tl.constexpr,
        BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, HAS_PASS: tl.constexpr,
    ):  # fmt: skip
        tok = tl.program_id(0).to(tl.int64)
        if HAS_POSITIONS:  # noqa: SIM108 (a constexpr branch, compiled out)
            pos = tl.load(POSITIONS + tok).to(tl.int64)
        else:
            pos = tok
        j = tl.arange(0, BLOCK_HALF)
        j_ok = j < half
        a1 = tl.load(ANGLES + pos * stride_angles + j, mask=j_ok, other=0.0)
        a2 = tl.load(ANGLES + pos * stride_angles + half + j, mask=j_ok, other=0.0)
        # cos/sin rounded to the input's dtype first: megatron-core's unfused order.
        dt = T.dtype.element_ty
        c1 = tl.cos(a1).to(dt).to(tl.float32)[None, :]
        c2 = tl.cos(a2).to(dt).to(tl.float32)[None, :]
        s1 = tl.sin(a1).to(dt).to(tl.float32)[None, :]
        s2 = tl.sin(a2).to(dt).to(tl.float32)[None, :]
        h = tl.arange(0, BLOCK_H)
        ok = (h < heads)[:, None] & j_ok[None, :]
        src = T + tok * stride_tok + h[:, None] * stride_head
        dst = OUT + tok * heads * dim + h[:, None] * dim
        x1 = tl.load(src + j[None, :], mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(src + half + j[None, :], mask=ok, other=0.0).to(tl.float32)
        y1, y2 = _rotate_halves(x1, x2, c1, c2, s1, s2, BACKWARD)
        tl.store(dst + j[None, :], y1.to(dt), mask=ok)
        tl.store(dst + half + j[None, :], y2.to(dt), mask=ok)
        if HAS_PASS:
            k = 2 * half + tl.arange(0, BLOCK_PASS)
            pass_ok = (h < heads)[:, None] & (k < dim)[None, :]
            rest = tl.load(src + k[None, :], mask=pass_ok, other=0.0)
            tl.store(dst + k[None, :], rest, mask=pass_ok)

    return rope
