"""Query/key RMSNorm and RoPE straight from the QKV projection, one Triton kernel each way.

Megatron's attention splits the fused QKV projection's output into query, key and value views,
copies the query into head order, normalises the query and the key (Qwen3's per-head norms),
then rotates each: five launches forward and more backward per layer, on a 1.7B step that waits
on the host's launches. Here one launch per token reads the projection's output where it lies
(``[tokens, groups, (heads_per_group + 2) * head_dim]``: a group's query heads, then its key and
its value), and writes the query and key normalised and rotated and the value as contiguous
tensors; backward reads the three gradients and writes the projection output's gradient in one
launch, with the two norm weights' gradients as per-program partial sums.

The math and its roundings are the unfused path's, step by step: the norm in fp32 rounded to the
storage dtype (``y = x * rstd * w``, ``rstd = 1 / sqrt(mean(x^2) + eps)``), then the rotation of
:mod:`vime.training.kernels.rope` (``cos``/``sin`` of the fp32 angles rounded to the dtype, the
product in fp32, rounded once). Backward: the transposed rotation rounded to the dtype, then the
norm's backward in fp32. Without norm weights only the rotation runs (Llama, Qwen2).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from vime.training.kernels import norm_weight_grad, reduction_programs, runs_here
from vime.training.kernels.rope import _rotate_halves


def available(t: torch.Tensor) -> bool:
    """Whether the kernels can take ``t`` here (CUDA, or Triton's interpreter)."""
    return runs_here(t) and _kernels() is not None


def split_norm_rope(
    mixed: torch.Tensor,
    heads_per_group: int,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    angles: torch.Tensor,
    positions: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query, key and value of a QKV projection's output, the query and key normalised
    (when weights are given) and rotated.

    ``mixed``: ``[tokens, groups, (heads_per_group + 2) * head_dim]`` with a unit last stride.
    ``angles``: ``[P, head_dim]`` fp32 (full-width rotation); token ``i`` takes row
    ``positions[i]``, or row ``i`` when ``positions`` is None. Returns contiguous
    ``[tokens, groups * heads_per_group, head_dim]``, ``[tokens, groups, head_dim]`` and
    ``[tokens, groups, head_dim]`` tensors.
    """
    if mixed.dim() != 3 or angles.dim() != 2:
        raise ValueError(
            f"qk_norm_rope: mixed [tokens, groups, width] and angles [P, head_dim], got "
            f"{tuple(mixed.shape)}, {tuple(angles.shape)}"
        )
    head_dim = angles.shape[1]
    if heads_per_group < 1 or mixed.shape[2] != (heads_per_group + 2) * head_dim:
        raise ValueError(
            f"qk_norm_rope: a group of {heads_per_group} query heads, a key and a value of "
            f"{head_dim} is {(heads_per_group + 2) * head_dim} wide, got {mixed.shape[2]}"
        )
    if head_dim % 2:
        raise ValueError(f"qk_norm_rope: head width {head_dim} must be even")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("qk_norm_rope: give both norm weights or neither")
    if q_weight is not None and q_weight.dtype != k_weight.dtype:
        raise ValueError(f"qk_norm_rope: norm weights of {q_weight.dtype} and {k_weight.dtype}")
    for w in (q_weight, k_weight):
        if w is not None and w.shape != (head_dim,):
            raise ValueError(f"qk_norm_rope: norm weight {tuple(w.shape)} for heads of {head_dim}")
    return _QKNormRope.apply(mixed, q_weight, k_weight, eps, angles, positions, heads_per_group)


def _blocks(groups: int, heads_per_group: int, head_dim: int) -> dict[str, int]:
    import triton

    return {
        "BLOCK_Q": triton.next_power_of_2(groups * heads_per_group),
        "BLOCK_G": triton.next_power_of_2(groups),
        "BLOCK_HALF": triton.next_power_of_2(head_dim // 2),
    }


class _QKNormRope(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        mixed: torch.Tensor,
        q_weight: torch.Tensor | None,
        k_weight: torch.Tensor | None,
        eps: float,
        angles: torch.Tensor,
        positions: torch.Tensor | None,
        heads_per_group: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        fwd, _ = _kernels()
        if mixed.stride(-1) != 1:
            mixed = mixed.contiguous()
        tokens, groups, _ = mixed.shape
        head_dim = angles.shape[1]
        heads = groups * heads_per_group
        q = torch.empty((tokens, heads, head_dim), dtype=mixed.dtype, device=mixed.device)
        k = torch.empty((tokens, groups, head_dim), dtype=mixed.dtype, device=mixed.device)
        v = torch.empty_like(k)
        norm = q_weight is not None
        fwd[(tokens,)](
            mixed, q, k, v, q_weight if norm else angles, k_weight if norm else angles,
            angles, positions if positions is not None else angles,
            mixed.stride(0), mixed.stride(1), angles.stride(0), groups, heads_per_group,
            head_dim // 2, eps,
            HAS_NORM=norm, HAS_POSITIONS=positions is not None,
            **_blocks(groups, heads_per_group, head_dim), num_warps=4,
        )  # fmt: skip
        ctx.save_for_backward(mixed, q_weight, k_weight, angles, positions)
        ctx.meta = (heads_per_group, eps)
        return q, k, v

    @staticmethod
    def backward(ctx: Any, dq: Any, dk: Any, dv: Any) -> tuple[Any, ...]:
        _, bwd = _kernels()
        mixed, q_weight, k_weight, angles, positions = ctx.saved_tensors
        heads_per_group, eps = ctx.meta
        tokens, groups, _ = mixed.shape
        head_dim = angles.shape[1]
        grads = []
        for g, count in ((dq, groups * heads_per_group), (dk, groups), (dv, groups)):
            if g is None:  # an output that got no gradient: its part of dmixed is zero
                g = mixed.new_zeros((tokens, count, head_dim))
            # Any token and head strides (attention's backward hands transposed gradients).
            grads.append(g if g.stride(-1) == 1 else g.contiguous())
        dq, dk, dv = grads
        dmixed = torch.empty((tokens, groups, mixed.shape[2]), dtype=mixed.dtype,
                             device=mixed.device)  # fmt: skip
        norm = q_weight is not None
        programs = min(tokens, reduction_programs(mixed.device))
        per_program = (tokens + programs - 1) // programs
        programs = (tokens + per_program - 1) // per_program
        # every program writes its row of partial sums (with norms; untouched without)
        partial = torch.empty((programs if norm else 1, 2, head_dim), dtype=torch.float32,
                              device=mixed.device)  # fmt: skip
        bwd[(programs,)](
            dq, dk, dv, mixed, dmixed, q_weight if norm else angles,
            k_weight if norm else angles, angles, positions if positions is not None else angles,
            partial, tokens, per_program, *dq.stride()[:2], *dk.stride()[:2], *dv.stride()[:2],
            mixed.stride(0), mixed.stride(1), angles.stride(0), groups, heads_per_group,
            head_dim // 2, eps,
            HAS_NORM=norm, HAS_POSITIONS=positions is not None,
            **_blocks(groups, heads_per_group, head_dim), num_warps=4,
        )  # fmt: skip
        dq_w = dk_w = None
        if norm:
            dq_w = norm_weight_grad(q_weight, partial[:, 0])
            dk_w = norm_weight_grad(k_weight, partial[:, 1])
        return dmixed, dq_w, dk_w, None, None, None, None


try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - torch wheels for CUDA ship Triton
    triton = None


@functools.cache
def _kernels() -> tuple[Any, Any] | None:
    """The forward and backward Triton kernels, or None without Triton."""
    if triton is None:
        return None
    return _forward, _backward


if triton is not None:

    @triton.jit
    def _cos_sin(
        ANGLES,
        POSITIONS,
        tok,
        stride_angles,
        j,
        j_ok,
        half,
        dt: tl.constexpr,
        HAS_POSITIONS: tl.constexpr,
    ):
        if HAS_POSITIONS:  # noqa: SIM108 (a constexpr branch, compiled out)
            pos = tl.load(POSITIONS + tok).to(tl.int64)
        else:
            pos = tok
        a1 = tl.load(ANGLES + pos * stride_angles + j, mask=j_ok, other=0.0)
        a2 = tl.load(ANGLES + pos * stride_angles + half + j, mask=j_ok, other=0.0)
        # cos/sin rounded to the input's dtype first: megatron-core's unfused order.
        c1 = tl.cos(a1).to(dt).to(tl.float32)[None, :]
        c2 = tl.cos(a2).to(dt).to(tl.float32)[None, :]
        s1 = tl.sin(a1).to(dt).to(tl.float32)[None, :]
        s2 = tl.sin(a2).to(dt).to(tl.float32)[None, :]
        return c1, c2, s1, s2

    @triton.jit
    def _norm_rope(
        src,
        dst,
        ok,
        W,
        j,
        j_ok,
        half,
        eps,
        c1,
        c2,
        s1,
        s2,
        dt: tl.constexpr,
        HAS_NORM: tl.constexpr,
    ):
        """Normalise (HAS_NORM) and rotate the heads at ``src`` (``[heads, 1]`` addresses of
        each head's first element); store them at ``dst``."""
        x1 = tl.load(src + j[None, :], mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(src + half + j[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_NORM:
            mean = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * half)
            rstd = (1.0 / tl.sqrt(mean + eps))[:, None]
            w1 = tl.load(W + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
            w2 = tl.load(W + half + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
            x1 = (x1 * rstd * w1).to(dt).to(tl.float32)
            x2 = (x2 * rstd * w2).to(dt).to(tl.float32)
        y1, y2 = _rotate_halves(x1, x2, c1, c2, s1, s2, False)
        tl.store(dst + j[None, :], y1.to(dt), mask=ok)
        tl.store(dst + half + j[None, :], y2.to(dt), mask=ok)

    @triton.jit
    def _forward(
        MIXED, Q, K, V, QW, KW, ANGLES, POSITIONS, stride_tok, stride_group, stride_angles,
        groups, per_group, half, eps,
        HAS_NORM: tl.constexpr, HAS_POSITIONS: tl.constexpr, BLOCK_Q: tl.constexpr,
        BLOCK_G: tl.constexpr, BLOCK_HALF: tl.constexpr,
    ):  # fmt: skip
        tok = tl.program_id(0).to(tl.int64)
        dt = Q.dtype.element_ty
        dim = 2 * half
        j = tl.arange(0, BLOCK_HALF)
        j_ok = j < half
        c1, c2, s1, s2 = _cos_sin(ANGLES, POSITIONS, tok, stride_angles, j, j_ok, half, dt,
                                  HAS_POSITIONS)  # fmt: skip
        row = MIXED + tok * stride_tok
        h = tl.arange(0, BLOCK_Q)
        heads = groups * per_group
        src = row + ((h // per_group) * stride_group + (h % per_group) * dim)[:, None]
        ok = (h < heads)[:, None] & j_ok[None, :]
        dst = Q + tok * heads * dim + h[:, None] * dim
        _norm_rope(src, dst, ok, QW, j, j_ok, half, eps, c1, c2, s1, s2, dt, HAS_NORM)
        g = tl.arange(0, BLOCK_G)
        g_ok = (g < groups)[:, None] & j_ok[None, :]
        key = row + (g * stride_group + per_group * dim)[:, None]
        _norm_rope(key, K + tok * groups * dim + g[:, None] * dim, g_ok, KW, j, j_ok, half, eps,
                   c1, c2, s1, s2, dt, HAS_NORM)  # fmt: skip
        value = key + dim
        out = V + tok * groups * dim + g[:, None] * dim
        tl.store(out + j[None, :], tl.load(value + j[None, :], mask=g_ok), mask=g_ok)
        tl.store(out + half + j[None, :], tl.load(value + half + j[None, :], mask=g_ok),
                 mask=g_ok)  # fmt: skip

    @triton.jit
    def _unrotate_denorm(grad, src, dst, ok, W, j, j_ok, half, c1, c2, s1, s2, eps, dt: tl.constexpr,
                         HAS_NORM: tl.constexpr, BLOCK_HALF: tl.constexpr):  # fmt: skip
        """The gradient of the heads at ``src`` from their output gradient at ``grad``, stored
        at ``dst``; returns the norm weight's gradient halves summed over the heads."""
        d1 = tl.load(grad + j[None, :], mask=ok, other=0.0).to(tl.float32)
        d2 = tl.load(grad + half + j[None, :], mask=ok, other=0.0).to(tl.float32)
        r1, r2 = _rotate_halves(d1, d2, c1, c2, s1, s2, True)
        g1 = r1.to(dt).to(tl.float32)  # the unfused rotation's backward writes the dtype
        g2 = r2.to(dt).to(tl.float32)
        dw1 = tl.zeros([BLOCK_HALF], dtype=tl.float32)
        dw2 = tl.zeros([BLOCK_HALF], dtype=tl.float32)
        if HAS_NORM:
            x1 = tl.load(src + j[None, :], mask=ok, other=0.0).to(tl.float32)
            x2 = tl.load(src + half + j[None, :], mask=ok, other=0.0).to(tl.float32)
            mean = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * half)
            rstd = (1.0 / tl.sqrt(mean + eps))[:, None]
            w1 = tl.load(W + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
            w2 = tl.load(W + half + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
            h1, h2 = x1 * rstd, x2 * rstd
            dw1 = tl.sum(g1 * h1, axis=0)
            dw2 = tl.sum(g2 * h2, axis=0)
            wg1, wg2 = g1 * w1, g2 * w2
            c = (tl.sum(h1 * wg1, axis=1) + tl.sum(h2 * wg2, axis=1)) / (2 * half)
            g1 = (wg1 - h1 * c[:, None]) * rstd
            g2 = (wg2 - h2 * c[:, None]) * rstd
        tl.store(dst + j[None, :], g1.to(dt), mask=ok)
        tl.store(dst + half + j[None, :], g2.to(dt), mask=ok)
        return dw1, dw2

    @triton.jit
    def _backward(
        DQ, DK, DV, MIXED, DMIXED, QW, KW, ANGLES, POSITIONS, DW_PARTIAL, tokens, per_program,
        stride_dq, stride_dq_head, stride_dk, stride_dk_head, stride_dv, stride_dv_head,
        stride_tok, stride_group, stride_angles, groups,
        per_group, half, eps,
        HAS_NORM: tl.constexpr, HAS_POSITIONS: tl.constexpr, BLOCK_Q: tl.constexpr,
        BLOCK_G: tl.constexpr, BLOCK_HALF: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        dt = DMIXED.dtype.element_ty
        dim = 2 * half
        heads = groups * per_group
        width = (per_group + 2) * dim
        j = tl.arange(0, BLOCK_HALF)
        j_ok = j < half
        h = tl.arange(0, BLOCK_Q)
        g = tl.arange(0, BLOCK_G)
        q_off = ((h // per_group) * stride_group + (h % per_group) * dim)[:, None]
        q_out = ((h // per_group) * width + (h % per_group) * dim)[:, None]
        k_off = (g * stride_group + per_group * dim)[:, None]
        k_out = (g * width + per_group * dim)[:, None]
        qw1 = tl.zeros([BLOCK_HALF], dtype=tl.float32)
        qw2 = tl.zeros([BLOCK_HALF], dtype=tl.float32)
        kw1 = tl.zeros([BLOCK_HALF], dtype=tl.float32)
        kw2 = tl.zeros([BLOCK_HALF], dtype=tl.float32)
        first = pid.to(tl.int64) * per_program
        for i in range(0, per_program):
            tok = first + i
            live = tok < tokens
            tok = tl.minimum(tok, tokens - 1)  # in range for the angles' row; stores masked
            c1, c2, s1, s2 = _cos_sin(ANGLES, POSITIONS, tok, stride_angles, j, j_ok, half, dt,
                                      HAS_POSITIONS)  # fmt: skip
            row = MIXED + tok * stride_tok
            out = DMIXED + tok * groups * width
            # past the last token no head is live (a scalar mask folded into the head count)
            ok = (h < tl.where(live, heads, 0))[:, None] & j_ok[None, :]
            a1, a2 = _unrotate_denorm(DQ + tok * stride_dq + h[:, None] * stride_dq_head, row + q_off,
                                      out + q_out, ok, QW, j, j_ok, half, c1, c2, s1, s2, eps,
                                      dt, HAS_NORM, BLOCK_HALF)  # fmt: skip
            qw1 += a1
            qw2 += a2
            g_ok = (g < tl.where(live, groups, 0))[:, None] & j_ok[None, :]
            b1, b2 = _unrotate_denorm(DK + tok * stride_dk + g[:, None] * stride_dk_head, row + k_off,
                                      out + k_out, g_ok, KW, j, j_ok, half, c1, c2, s1, s2, eps,
                                      dt, HAS_NORM, BLOCK_HALF)  # fmt: skip
            kw1 += b1
            kw2 += b2
            dv = DV + tok * stride_dv + g[:, None] * stride_dv_head
            v_out = out + k_out + dim
            tl.store(v_out + j[None, :], tl.load(dv + j[None, :], mask=g_ok), mask=g_ok)
            tl.store(v_out + half + j[None, :], tl.load(dv + half + j[None, :], mask=g_ok),
                     mask=g_ok)  # fmt: skip
        if HAS_NORM:
            base = DW_PARTIAL + pid * 2 * dim
            tl.store(base + j, qw1, mask=j_ok)
            tl.store(base + half + j, qw2, mask=j_ok)
            tl.store(base + dim + j, kw1, mask=j_ok)
            tl.store(base + dim + half + j, kw2, mask=j_ok)
