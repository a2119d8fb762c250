"""Causal attention over packed micro-batches, shared by both trainer backends.

A micro-batch packs several sequences into one row. Attending through a block-causal
``[T, T]`` mask computes every pair of tokens in the row, and on CPU SDPA has no fused kernel
for an arbitrary mask: with 16 sequences of ~200 tokens that is 16x the work of attending
within each sequence (SmolLM2-135M on 2 cores: attention was 13 s of a 25 s train step).
:func:`packed_causal_sdpa` runs SDPA's causal kernel once per sequence instead.

For transformers models the same function is registered as the attention implementation
``packed_sdpa`` (the torch backend's default ``--attn-implementation``); the trainer passes
the packed bounds with each forward as ``vime_bounds``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

HF_PACKED_SDPA = "packed_sdpa"

# SDPA's CUDA kernels in the trainers' order of preference. cuDNN, torch's first choice on
# Hopper, builds a plan for each new sequence length (86-150 ms on an H100), and an RL batch's
# lengths are new at every step: packed attention over 8 sequences of fresh lengths took 1,013
# ms forward + backward through cuDNN and 5.4 ms through flash (16/8 heads of 128, 16,384
# tokens). So SDPA itself picks flash; cuDNN stays enabled, last, where SDPA never reaches it
# (the math kernel before it takes anything), for the long sequences that :data:`CUDNN_FROM`
# sends to it directly.
FLASH_FIRST: tuple[SDPBackend, ...] = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
    SDPBackend.CUDNN_ATTENTION,
)
# The order in force (the benches swap it); None leaves the choice to torch.
CUDA_SDPA_BACKENDS: tuple[SDPBackend, ...] | None = FLASH_FIRST

# Sequences of at least this many tokens attend through cuDNN on CUDA, padded at the end to a
# multiple of CUDNN_BUCKET tokens, so that a run plans one shape per bucket rather than one per
# length. Causal queries never see the keys after them, so the padding changes no real token's
# output or gradient. Once planned, cuDNN's kernel is 1.3-1.9x flash's from 2,048 tokens on
# (H100s, bench/sdpa_kernels.py); below, the two trade places between hosts. None: flash only.
CUDNN_FROM: int | None = 2048
CUDNN_BUCKET = 256


def cudnn_first() -> tuple[SDPBackend, ...]:
    """:data:`CUDA_SDPA_BACKENDS` with cuDNN in front (torch's own first choice on Hopper): the
    order the benches' ``cudnn`` rows measure the default against."""
    rest = CUDA_SDPA_BACKENDS or FLASH_FIRST
    return (SDPBackend.CUDNN_ATTENTION, *(b for b in rest if b != SDPBackend.CUDNN_ATTENTION))


# SDPA's fused CPU kernel pays a fixed ~2 ms in its bf16/fp16 backward whatever the length
# (9 heads of 64 on 2 cores: 2.1 ms fwd+bwd at 128 tokens, 0.9 ms in fp32); from about 256
# tokens on, the half-precision kernel is the faster (8.2 vs 9.7 ms at 512).
CPU_FP32_ATTENTION_BELOW = 256


def _heads_first(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """``[b, s, h, d]`` -> ``[b, h, s, d]`` views; grouped key/value heads are repeated to the
    query's count unless SDPA reads them as they are (``gqa``, default: on CUDA)."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    grouped = k.shape[1] != q.shape[1]
    gqa = grouped and (q.is_cuda if gqa is None else gqa)
    if grouped and not gqa:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return q, k, v, gqa


def _cpu_half_dtype(q: torch.Tensor) -> torch.dtype | None:
    """The half-precision dtype SDPA would compute ``q`` in on the CPU (its own, or CPU
    autocast's, which casts SDPA's inputs), else None."""
    if q.device.type != "cpu":
        return None
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else q.dtype
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout: float,
    scale: float | None,
    gqa: bool,
    prefix: int = 0,
) -> torch.Tensor:
    """Causal SDPA of ``[b, h, s, d]`` tensors whose keys and values may start with ``prefix``
    entries every query sees (a shared prompt). A short sequence that the CPU would attend in
    half precision is computed in fp32 (:data:`CPU_FP32_ATTENTION_BELOW`) and returned in that
    half-precision dtype, as SDPA would have returned it."""
    mask = None
    if not prefix and (out := _cudnn_bucketed(q, k, v, dropout, scale, gqa)) is not None:
        return out
    if prefix:
        if _flash_takes(q, k, v, dropout, gqa):
            # Flash's causal mask is aligned to the bottom right when there are more keys than
            # queries: query i sees keys 0 .. prefix + i, and the kernel reads grouped heads.
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, dropout, is_causal=True, return_debug_mask=False, scale=scale
            )[0]
        if gqa:  # the flash path of a lower-right causal bias takes no grouped heads
            rep = q.shape[1] // k.shape[1]
            k, v, gqa = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), False
        # Query i sees keys 0 .. prefix + i: on CUDA the flash kernel's own causal alignment,
        # no [s, prefix + s] mask; the CPU builds that mask.
        mask = causal_lower_right(q.shape[2], k.shape[2])
    half = _cpu_half_dtype(q)
    if half is None or k.shape[2] >= CPU_FP32_ATTENTION_BELOW:
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=dropout,
            is_causal=mask is None,
            scale=scale,
            enable_gqa=gqa,
        )
    with torch.autocast("cpu", enabled=False):  # autocast would cast fp32 inputs to bf16
        out = F.scaled_dot_product_attention(
            q.float(),
            k.float(),
            v.float(),
            attn_mask=mask,
            dropout_p=dropout,
            is_causal=mask is None,
            scale=scale,
            enable_gqa=gqa,
        )
    return out.to(half)


def _flash_takes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, gqa: bool
) -> bool:
    """Whether SDPA's flash kernel may run these ``[b, h, s, d]`` CUDA tensors, by SDPA's own
    checks (dtype, head size, device), and :data:`CUDA_SDPA_BACKENDS` puts it first."""
    if (
        not q.is_cuda
        or not CUDA_SDPA_BACKENDS
        or CUDA_SDPA_BACKENDS[0] != SDPBackend.FLASH_ATTENTION
    ):
        return False
    # is_causal off: SDPA refuses flash for a causal mask of more keys than queries, whose
    # alignment differs from flash's; the mask here is flash's own (bottom right).
    params = torch.backends.cuda.SDPAParams(q, k, v, None, dropout, False, gqa)
    return torch.backends.cuda.can_use_flash_attention(params, False)


def _cudnn_bucketed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout: float,
    scale: float | None,
    gqa: bool,
) -> torch.Tensor | None:
    """Causal cuDNN attention of a ``[b, h, s, d]`` CUDA sequence of :data:`CUDNN_FROM` tokens
    or more, padded to a multiple of :data:`CUDNN_BUCKET`; None where that does not apply (short,
    on the CPU, or cuDNN refused by SDPA's own checks or by :data:`CUDA_SDPA_BACKENDS`)."""
    length = q.shape[2]
    if CUDNN_FROM is None or length < CUDNN_FROM or not q.is_cuda:
        return None
    params = torch.backends.cuda.SDPAParams(q, k, v, None, dropout, True, gqa)
    if not torch.backends.cuda.can_use_cudnn_attention(params, False):
        return None
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))

    def cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, grad, dropout, True, False, scale=scale
        )[0]

    return padded_causal(cudnn, q, k, v, CUDNN_BUCKET)


def padded_causal(
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bucket: int,
) -> torch.Tensor:
    """``attend`` (causal attention of ``[b, h, s, d]`` tensors) run on ``q``, ``k``, ``v``
    zero-padded at the end to a multiple of ``bucket`` tokens, cut back to their length: the
    same values and gradients, since no real query sees a padded key and the padded queries'
    outputs, cut off, pass back no gradient."""
    length = q.shape[2]
    pad = -length % bucket
    if not pad:
        return attend(q, k, v)
    return attend(*(F.pad(t, (0, 0, 0, pad)) for t in (q, k, v)))[:, :, :length]


@contextlib.contextmanager
def _cuda_kernels(q: torch.Tensor) -> Iterator[None]:
    """SDPA restricted to :data:`CUDA_SDPA_BACKENDS` for CUDA tensors (once per attention call,
    not per packed sequence: entering it costs some 20 us of host time)."""
    if not q.is_cuda or CUDA_SDPA_BACKENDS is None:
        yield
        return
    with sdpa_kernel(list(CUDA_SDPA_BACKENDS), set_priority=True):
        yield


def causal_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dropout: float = 0.0,
    scale: float | None = None,
    gqa: bool | None = None,
) -> torch.Tensor:
    """Causal attention of ``[b, s, h, d]`` queries over ``[b, s, g, d]`` keys/values (``g``
    dividing ``h``) -> ``[b, s, h, d]``.

    ``gqa`` (default: on CUDA) hands SDPA the grouped key/value heads as they are
    (``enable_gqa``); the fused CUDA kernels read the groups directly, saving the repeat's
    copies forward and their reduction backward (H200, Qwen3-4B shape: 1.13 vs 1.22 ms per
    call). On CPU only SDPA's math kernel takes ``enable_gqa``, so the heads are repeated there
    to keep the fused CPU kernel. Both give the same values (tested in fp32). On CPU, sequences
    shorter than :data:`CPU_FP32_ATTENTION_BELOW` tokens that would attend in bf16 or fp16
    (their dtype, or CPU autocast's) attend in fp32.
    """
    q, k, v, gqa = _heads_first(q, k, v, gqa)
    with _cuda_kernels(q):
        return _sdpa(q, k, v, dropout, scale, gqa).transpose(1, 2)


def packed_causal_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bounds: Sequence[int],
    *,
    parents: Sequence[int] | None = None,
    dropout: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """:func:`causal_sdpa` of ``[1, T, h, d]`` packed segments whose starts and end are
    ``bounds`` (``0 = b_0 < b_1 < ... = T``): each segment attends only within itself, and a
    segment whose ``parents`` entry is another segment's index (a shared prompt's, which has
    none itself) first attends to all of that one, as if it preceded it.

    The row is cut with ``split``, whose backward is one concatenation: slicing it per
    sequence made each slice's backward fill and add a whole-row gradient (16 sequences x 30
    layers: 0.35 s of a 4.5 s CPU train step)."""
    if q.shape[0] != 1:
        raise ValueError(f"packed attention takes one packed row, got a batch of {q.shape[0]}")
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != q.shape[1]:
        raise ValueError(f"packed bounds {list(bounds)[:8]} do not cover the {q.shape[1]} tokens")
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    if min(sizes) < 1:
        raise ValueError(f"packed bounds {list(bounds)[:8]} hold an empty sequence")
    parents = list(parents) if parents is not None else [-1] * len(sizes)
    if len(parents) != len(sizes) or any(
        p >= i or (p >= 0 and parents[p] >= 0) for i, p in enumerate(parents)
    ):
        raise ValueError(
            f"packed parents {parents[:8]} must give each of the {len(sizes)} segments -1 or "
            "the index of an earlier segment that has no parent itself"
        )
    q, k, v, gqa = _heads_first(q, k, v, None)
    if len(sizes) == 1:
        with _cuda_kernels(q):
            return _sdpa(q, k, v, dropout, scale, gqa).transpose(1, 2)
    ks, vs = k.split(sizes, 2), v.split(sizes, 2)
    outs = []
    with _cuda_kernels(q):
        for i, (qi, ki, vi) in enumerate(zip(q.split(sizes, 2), ks, vs, strict=True)):
            p = parents[i]
            if p >= 0:  # the shared prompt's keys and values first; their gradients add up
                ki, vi = torch.cat([ks[p], ki], dim=2), torch.cat([vs[p], vi], dim=2)
            outs.append(_sdpa(qi, ki, vi, dropout, scale, gqa, sizes[p] if p >= 0 else 0))
    # Joined along the tokens: a contiguous [1, T, h, d], so the callers' reshape to
    # [T, h * d] is a view, not a second copy of the whole output.
    return torch.cat([o.transpose(1, 2) for o in outs], dim=1)


def _bounds_from_positions(position_ids: torch.Tensor | None, length: int) -> list[int]:
    """Sequence starts where the positions restart at 0 (a host read: the trainer passes
    ``vime_bounds`` so that no layer waits for the device)."""
    if position_ids is None:
        return [0, length]
    starts = (position_ids[0] == 0).nonzero()[:, 0].tolist()
    return sorted({0, *starts, length})


def hf_packed_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    vime_bounds: Sequence[int] | None = None,
    vime_parents: Sequence[int] | None = None,
    position_ids: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``[b, heads, s, d]`` in, ``[b, s, heads, d]``
    out. Unpadded rows only: one packed row, or a batch of whole sequences."""
    if sliding_window is not None:
        raise ValueError(
            f"--attn-implementation {HF_PACKED_SDPA} does not do sliding-window attention "
            f"(layer {getattr(module, 'layer_idx', '?')}); use --attn-implementation sdpa"
        )
    if attention_mask is not None:
        raise ValueError(f"{HF_PACKED_SDPA} attention takes no padding mask: pack sequences")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    if q.shape[0] > 1:
        return causal_sdpa(q, k, v, dropout=dropout, scale=scaling), None
    if vime_parents is not None and vime_bounds is None:
        raise ValueError("vime_parents (shared prompts) needs the vime_bounds they refer to")
    bounds = vime_bounds or _bounds_from_positions(position_ids, q.shape[1])
    out = packed_causal_sdpa(q, k, v, bounds, parents=vime_parents, dropout=dropout, scale=scaling)
    return out, None


def register_hf_attention() -> None:
    """Make ``attn_implementation="packed_sdpa"`` known to transformers (idempotent). No mask
    function is registered, so transformers builds no ``[T, T]`` mask for it."""
    from transformers import AttentionInterface

    AttentionInterface.register(HF_PACKED_SDPA, hf_packed_sdpa)
