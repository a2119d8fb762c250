"""transformers' attention with its query, key and value projections stacked
(``--hf-qkv-fusion``, on the bf16 weight copy).

transformers projects the query, the key and the value with three matmuls, then (Qwen3)
normalises the query and the key, then rotates both: on a 1.7B step that waits on the host,
seven launches a layer forward and more backward. With the bf16 weight copy
(:mod:`vime.training.weight_copy`) the three weights' copies are one tensor in the Megatron
backend's grouped layout (per key/value head: its query heads, its key, its value), so the
projection is one matmul, and :func:`vime.training.kernels.qk_norm_rope.split_norm_rope` (the
Megatron backend's kernel) reads its output once and writes the query and key normalised and
rotated and the value, one launch each way. The attention itself and the output projection are
transformers' own (the attention function the model was loaded with).

The math is the unfused path's: the norm in fp32 rounded once, the rotation by ``cos``/``sin`` of
the fp32 angles ``position * inv_freq`` rounded to the dtype, the product in fp32. Covered:
bias-free projections, every query head group of one key/value head, the default RoPE (no
scaling); anything else keeps transformers' forward (:func:`qkv_modules` leaves it out).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from vime.training.kernels import qk_norm_rope

ATTENTION_CLASSES = frozenset(
    {"LlamaAttention", "Qwen3Attention", "Qwen3MoeAttention", "MistralAttention"}
)
_NORM_CLASSES = frozenset({"Qwen3RMSNorm", "Qwen3MoeRMSNorm"})


def qkv_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The attention modules routed by :func:`vime.training.hf_kernels.install` whose query,
    key and value a weight copy can stack here (see the module docstring)."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if (
        rotary is None
        or getattr(rotary, "rope_type", None) != "default"
        or getattr(rotary, "attention_scaling", None) != 1.0
    ):
        return []
    found = []
    for module in model.modules():
        if type(module).__name__ in ATTENTION_CLASSES and _stackable(module):
            module._vime_rotary = rotary  # read at each forward: .to() replaces its buffer
            found.append(module)
    return found


def _stackable(attn: Any) -> bool:
    projections = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    if getattr(attn, "_vime_forward", None) is None or not all(
        type(p) is torch.nn.Linear and p.bias is None for p in projections
    ):
        return False
    head = getattr(attn, "head_dim", 0)
    q, k, v = (p.weight for p in projections)
    if not head or head % 2 or k.shape != v.shape or k.shape[0] % head or q.shape[1] != k.shape[1]:
        return False
    groups = k.shape[0] // head
    if q.shape[0] % (groups * head) or not qk_norm_rope.available(q):
        return False
    norms = [getattr(attn, n, None) for n in ("q_norm", "k_norm")]
    if norms == [None, None]:
        return True
    return all(type(n).__name__ in _NORM_CLASSES for n in norms) and (
        norms[0].variance_epsilon == norms[1].variance_epsilon
    )


def groups_of(attn: torch.nn.Module) -> tuple[int, int, int]:
    """(key/value heads, query heads per key/value head, head width) of ``attn``."""
    head = attn.head_dim
    groups = attn.k_proj.weight.shape[0] // head
    return groups, attn.q_proj.weight.shape[0] // (groups * head), head


def stacked_attention(self: Any, *args: Any, **kwargs: Any) -> Any:
    """The forward of a routed attention module: transformers' own unless a weight copy has
    set ``_vime_qkv`` (the stacked copy), then the stacked path of the module docstring."""
    stacked = getattr(self, "_vime_qkv", None)
    if stacked is None:
        return self._vime_forward(*args, **kwargs)
    if len(args) > 1 or kwargs.get("past_key_values") is not None:
        raise RuntimeError(
            "the stacked query/key/value copy serves training forwards from transformers' "
            "decoder layers (keyword arguments, no KV cache); run this call outside the "
            "weight copy or with --no-hf-qkv-fusion"
        )
    hidden = args[0] if args else kwargs.pop("hidden_states")
    kwargs.pop("position_embeddings", None)
    kwargs.pop("past_key_values", None)
    attention_mask = kwargs.pop("attention_mask", None)
    positions = kwargs.get("position_ids")
    batch, seq = hidden.shape[:-1]
    if positions is None:
        positions = torch.arange(seq, device=hidden.device).expand(batch, seq)
    groups, per_group, head = groups_of(self)
    mixed = torch.nn.functional.linear(hidden, stacked).view(batch * seq, groups, -1)
    norms = [getattr(self, "q_norm", None), getattr(self, "k_norm", None)]
    q, k, v = qk_norm_rope.split_norm_rope(
        mixed,
        per_group,
        norms[0].weight if norms[0] is not None else None,
        norms[1].weight if norms[1] is not None else None,
        norms[0].variance_epsilon if norms[0] is not None else 0.0,
        _angles(positions, self._vime_rotary.inv_freq),
        None,
    )
    q, k, v = (t.view(batch, seq, -1, head).transpose(1, 2) for t in (q, k, v))
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = sys.modules[type(self).__module__].eager_attention_forward
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager)
    if hasattr(self, "sliding_window"):
        kwargs["sliding_window"] = self.sliding_window
    out, weights = interface(
        self, q, k, v, attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling,
        **kwargs,
    )  # fmt: skip
    return self.o_proj(out.reshape(batch, seq, -1).contiguous()), weights


_cached: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (positions, inv_freq, angles)


def _angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Each token's fp32 rotation angles ``[tokens, head_dim]`` (``position * inv_freq``, twice,
    as transformers' rotary embedding computes them), once per forward: every layer of one
    forward passes the same ``position_ids`` tensor."""
    if _cached and _cached[0][0] is positions and _cached[0][1] is inv_freq:
        return _cached[0][2]
    freqs = positions.reshape(-1, 1).float() * inv_freq.float().reshape(1, -1)
    angles = torch.cat((freqs, freqs), dim=-1)
    _cached[:] = [(positions, inv_freq, angles)]
    return angles
