"""Fused kernels for two of megatron-core's fusion slots that otherwise need Apex or
TransformerEngine, which this backend does not install.

- **Weight-gradient accumulation** (``gradient_accumulation_fusion``): megatron-core's linears
  call ``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(input, grad_output, main_grad)``
  to add ``grad_outputᵀ · input`` straight into the fp32 ``main_grad`` buffer. Without it each
  weight gradient is first written as a bf16 tensor and then added to ``main_grad`` by a
  separate kernel, per parameter and micro-batch. Here it is one GEMM with ``beta=1`` into the
  fp32 buffer (:func:`vime.training.gemm.wgrad_gemm_accum_fp32`: torch's ``out_dtype`` GEMM on
  CUDA; an fp32 ``addmm_`` otherwise). The RMSNorm and query/key norm kernels add their weights'
  gradients there too under this flag (:func:`vime.training.kernels.norm_weight_grad`).
- **RoPE** (``apply_rope_fusion``): megatron-core's unfused rotary embedding runs a chunk, a
  negation, a concatenation, two multiplications and an addition each way per query and key,
  and its packed (``thd``) form reads the sequence bounds back to the host in every layer.
  Here the rotation is one Triton kernel each way on CUDA (:mod:`vime.training.kernels.rope`;
  elsewhere one ``torch.compile``'d function), and packed positions are computed on the device
  once per micro-batch.

:func:`install` puts both where megatron-core looks for them; the model builder calls it before
building layers whose config enables either fusion. :func:`install_swiglu` does the same for
SwiGLU (``bias_activation_fusion``): megatron-core's own fused function, whose math runs in
Triton kernels on CUDA (:mod:`vime.training.kernels.swiglu`) instead of its compiled code.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from vime.training.gemm import wgrad_gemm_accum_fp32
from vime.training.kernels import rope as rope_kernel


def wgrad_gemm_accum_fp16(
    total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor
) -> None:
    """``main_grad += grad_outputᵀ · total_input`` for a bf16/fp16 ``main_grad``."""
    main_grad.addmm_(grad_output.t().to(main_grad.dtype), total_input.to(main_grad.dtype))


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``t·cos + rotate_half(t)·sin`` over the last dimension (non-interleaved halves)."""
    half = t.shape[-1] // 2
    t1, t2 = t[..., :half], t[..., half:]
    return torch.cat(
        (t1 * cos[..., :half] - t2 * sin[..., :half], t2 * cos[..., half:] + t1 * sin[..., half:]),
        dim=-1,
    )


@functools.cache
def _compiled_rotate() -> Any:
    # dynamic: RL micro-batches change length every step; one graph serves them all.
    return torch.compile(_rotate, dynamic=True)


def _apply(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """RoPE of ``t`` (``[..., d]``) with ``freqs`` broadcastable to it (``[..., rot_dim]``)."""
    rot = freqs.shape[-1]
    # cos/sin in fp32, then rounded to t's dtype: megatron-core's unfused order.
    cos, sin = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    if rot == t.shape[-1]:
        return _compiled_rotate()(t, cos, sin)
    return torch.cat((_compiled_rotate()(t[..., :rot], cos, sin), t[..., rot:]), dim=-1)


def fused_apply_rotary_pos_emb(
    t: torch.Tensor, freqs: torch.Tensor, interleaved: bool = False, **_: Any
) -> torch.Tensor:
    """RoPE of ``[s, b, heads, d]`` ``t`` with ``[s, 1, 1, rot_dim]`` ``freqs``."""
    if interleaved:
        raise NotImplementedError("fused RoPE: interleaved rotary layout is not supported")
    freqs = freqs[: t.shape[0]]
    if rope_kernel.available(t):
        s, b, heads, d = t.shape
        angles, positions = rope_angles(freqs, s, b, None)
        return rope_kernel.rotate(t.reshape(s * b, heads, d), angles, positions).view(t.shape)
    return _apply(t, freqs)


def rope_angles(
    freqs: torch.Tensor, s: int, b: int, cu_seqlens: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The kernels' fp32 angle rows (``[P, rot]``) and each token's row (None: token ``i``
    takes row ``i``) for megatron's ``freqs``: ``[s, b]`` tokens flattened in that order, or
    ``s`` packed tokens whose sequences start at ``cu_seqlens`` (positions restart at each
    sequence, unless ``freqs`` covers every packed token: megatron's exact-offset mode)."""
    if cu_seqlens is None:
        angles = freqs[:s].reshape(s, freqs.shape[-1]).float()
        return angles, None if b == 1 else _batch_positions(s, b, freqs.device)
    angles = freqs.reshape(freqs.shape[0], freqs.shape[-1]).float()
    return angles, None if freqs.shape[0] == s else _thd_positions(cu_seqlens, s)


@functools.lru_cache(maxsize=8)
def _batch_positions(s: int, b: int, device: torch.device) -> torch.Tensor:
    """Row ``i // b`` of the angles for token ``i`` of an ``[s, b]`` layout flattened."""
    return torch.arange(s * b, device=device) // b


_packed_positions: list[Any] = []  # [(cu_seqlens, tokens, positions)]: the micro-batch's


def _thd_positions(cu_seqlens: torch.Tensor, tokens: int) -> torch.Tensor:
    """Each packed token's position within its sequence, computed on the device once per
    micro-batch (every layer's query and key pass the same ``cu_seqlens`` tensor)."""
    cached = _packed_positions[0] if _packed_positions else None
    if cached is not None and cached[0] is cu_seqlens and cached[1] == tokens:
        return cached[2]
    index = torch.arange(tokens, device=cu_seqlens.device)
    starts = cu_seqlens.to(index.dtype)
    owner = torch.searchsorted(starts[1:], index, right=True)
    positions = index - starts[owner]
    _packed_positions[:] = [(cu_seqlens, tokens, positions)]
    return positions


def fused_apply_rotary_pos_emb_thd(
    t: torch.Tensor,
    cu_seqlens: torch.Tensor,
    freqs: torch.Tensor,
    cp_size: int = 1,
    cp_rank: int = 0,
    **_: Any,
) -> torch.Tensor:
    """RoPE of packed ``[tokens, heads, d]`` ``t`` whose sequences start at ``cu_seqlens``.

    Positions restart at each sequence; when ``freqs`` covers every packed token (megatron's
    exact-offset mode) token ``i`` takes ``freqs[i]``. Computed on the device: no host read.
    """
    if cp_size != 1:
        raise NotImplementedError("fused RoPE: context parallelism is not supported")
    tokens = t.shape[0]
    exact = freqs.shape[0] == tokens
    if rope_kernel.available(t):
        return rope_kernel.rotate(t, *rope_angles(freqs, tokens, 1, cu_seqlens))
    if exact:
        return _apply(t, freqs.reshape(tokens, 1, freqs.shape[-1]))
    positions = _thd_positions(cu_seqlens, tokens)
    return _apply(t, freqs[positions].reshape(tokens, 1, freqs.shape[-1]))


def install() -> None:
    """Make megatron-core use these kernels for ``gradient_accumulation_fusion`` and
    ``apply_rope_fusion`` (idempotent)."""
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.tensor_parallel import layers

    layers.fused_weight_gradient_mlp_cuda = types.SimpleNamespace(
        wgrad_gemm_accum_fp32=wgrad_gemm_accum_fp32,
        wgrad_gemm_accum_fp16=wgrad_gemm_accum_fp16,
    )
    layers._grad_accum_fusion_available = True
    rope_utils.fused_apply_rotary_pos_emb = fused_apply_rotary_pos_emb
    rope_utils.fused_apply_rotary_pos_emb_thd = fused_apply_rotary_pos_emb_thd


def install_swiglu() -> None:
    """Make megatron-core's fused SwiGLU (no bias) run :mod:`vime.training.kernels.swiglu` where
    its kernels run, and its own compiled functions elsewhere (idempotent)."""
    from megatron.core.fusions import fused_bias_swiglu as module

    from vime.training.kernels import swiglu

    for name, kernel in (("swiglu", swiglu.swiglu), ("swiglu_back", swiglu.swiglu_back)):
        current = getattr(module, name)
        if not hasattr(current, "vime_fallback"):
            setattr(module, name, swiglu.dispatching(kernel, current))
