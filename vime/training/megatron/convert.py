"""HF <-> Megatron weight conversion and tensor-parallel sharding, as pure tensor functions.

Megatron's fused ``linear_qkv`` rows are grouped per key/value head: for each group, its
``heads_per_group`` query heads, then its key head, then its value head. ``linear_fc1`` is
``[gate; up]`` (SwiGLU). Under tensor parallelism every rank holds whole groups of ``linear_qkv``
and ``[gate_r; up_r]`` of ``linear_fc1``; column-parallel weights (and the vocab-parallel
embedding and output layer) split along rows, row-parallel ones along columns.

Mixture-of-experts layers (Qwen3-MoE) hold ``mlp.router.weight`` (HF ``mlp.gate.weight``) and
one SwiGLU MLP per expert, ``mlp.experts.local_experts.{e}.linear_fc1/linear_fc2`` (HF
``mlp.experts.{e}.gate_proj/up_proj/down_proj``, as checkpoints store them; transformers'
in-memory fused ``gate_up_proj``/``down_proj`` are read too). In a full state dict ``e`` is the
global expert index; under expert parallelism a rank's ``local_experts.{i}`` is global expert
``ep_rank * experts_per_rank + i`` (:func:`expert_to_global`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from vime.training.megatron.arch import GPTArch

if TYPE_CHECKING:
    import torch

_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_EXPERT = re.compile(r"(.*mlp\.experts\.local_experts\.)(\d+)(\.linear_fc[12]\.weight)")
_DENSE_MLP = ("mlp.linear_fc2.weight",)

# Megatron suffix -> HF suffix, for the weights that map one to one.
_SIMPLE = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_TOP = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}
# How each Megatron weight is split under TP: 0 along rows, 1 along columns, None replicated.
_COLUMN = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias")
_ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")


class ConversionError(ValueError):
    """A state dict does not match the model it is converted for."""


def _qkv_fuse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: GPTArch) -> torch.Tensor:
    """``[q; k; v]`` projections (rows per head) -> Megatron's per-group layout."""
    import torch

    d, g, per = arch.head_dim, arch.num_kv_heads, arch.heads_per_group
    tail = q.shape[1:]
    q = q.reshape(g, per * d, *tail)
    k = k.reshape(g, d, *tail)
    v = v.reshape(g, d, *tail)
    return torch.cat([q, k, v], dim=1).reshape(g * (per + 2) * d, *tail)


def _qkv_split(qkv: torch.Tensor, arch: GPTArch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`_qkv_fuse`."""
    d, g, per = arch.head_dim, arch.num_kv_heads, arch.heads_per_group
    tail = qkv.shape[1:]
    grouped = qkv.reshape(g, (per + 2) * d, *tail)
    q, k, v = grouped.split([per * d, d, d], dim=1)
    return (
        q.reshape(g * per * d, *tail),
        k.reshape(g * d, *tail),
        v.reshape(g * d, *tail),
    )


def _experts_to_megatron(
    take: Callable[[str], torch.Tensor],
    hf: Mapping[str, torch.Tensor],
    hf_p: str,
    mg_p: str,
    arch: GPTArch,
) -> dict[str, torch.Tensor]:
    """One MoE layer's router and experts, from per-expert or fused HF tensors."""
    import torch

    out = {mg_p + "mlp.router.weight": take(hf_p + "mlp.gate.weight")}
    experts = mg_p + "mlp.experts.local_experts."
    fused = hf_p + "mlp.experts.gate_up_proj"
    if fused in hf:
        # transformers' in-memory layout: [E, 2I, H] (gate rows, then up rows) and [E, H, I].
        gate_up, down = take(fused), take(hf_p + "mlp.experts.down_proj")
        if gate_up.shape[0] != arch.num_experts or down.shape[0] != arch.num_experts:
            raise ConversionError(
                f"{fused} holds {gate_up.shape[0]} experts, the config {arch.num_experts}"
            )
        for e in range(arch.num_experts):
            out[f"{experts}{e}.linear_fc1.weight"] = gate_up[e]
            out[f"{experts}{e}.linear_fc2.weight"] = down[e]
        return out
    for e in range(arch.num_experts):
        hf_e = f"{hf_p}mlp.experts.{e}."
        out[f"{experts}{e}.linear_fc1.weight"] = torch.cat(
            [take(hf_e + "gate_proj.weight"), take(hf_e + "up_proj.weight")]
        )
        out[f"{experts}{e}.linear_fc2.weight"] = take(hf_e + "down_proj.weight")
    return out


def hf_to_megatron(hf: Mapping[str, torch.Tensor], arch: GPTArch) -> dict[str, torch.Tensor]:
    """Full (unsharded) Megatron state dict from an HF one; raises ``ConversionError``.

    Every tensor the model needs must be present; HF's ``lm_head.weight`` is ignored for tied
    embeddings, and any other unused name is an error (a sign of the wrong architecture).
    """
    import torch

    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ConversionError(f"the HF weights have no {name!r} ({arch.model_type} model)")
        used.add(name)
        return hf[name]

    out: dict[str, torch.Tensor] = {
        "embedding.word_embeddings.weight": take("model.embed_tokens.weight"),
        "decoder.final_layernorm.weight": take("model.norm.weight"),
    }
    if arch.tied_embeddings:
        used.add("lm_head.weight")
    else:
        out["output_layer.weight"] = take("lm_head.weight")
    for i in range(arch.num_layers):
        hf_p, mg_p = f"model.layers.{i}.", f"decoder.layers.{i}."
        for mg, hf_name in _SIMPLE.items():
            if "layernorm.weight" in mg and "self_attention" in mg and not arch.qk_norm:
                continue
            if mg in _DENSE_MLP and arch.is_moe:
                continue
            out[mg_p + mg] = take(hf_p + hf_name)
        att = hf_p + "self_attn."
        out[mg_p + "self_attention.linear_qkv.weight"] = _qkv_fuse(
            take(att + "q_proj.weight"),
            take(att + "k_proj.weight"),
            take(att + "v_proj.weight"),
            arch,
        )
        if arch.qkv_bias:
            out[mg_p + "self_attention.linear_qkv.bias"] = _qkv_fuse(
                take(att + "q_proj.bias"),
                take(att + "k_proj.bias"),
                take(att + "v_proj.bias"),
                arch,
            )
        if arch.is_moe:
            out.update(_experts_to_megatron(take, hf, hf_p, mg_p, arch))
        else:
            out[mg_p + "mlp.linear_fc1.weight"] = torch.cat(
                [take(hf_p + "mlp.gate_proj.weight"), take(hf_p + "mlp.up_proj.weight")]
            )
    extra = sorted(set(hf) - used)
    if extra:
        raise ConversionError(
            f"the HF weights have {len(extra)} names this {arch.model_type} model does not use, "
            f"e.g. {extra[:3]}; is the config the one these weights were saved with?"
        )
    return out


def to_hf(name: str, tensor: torch.Tensor, arch: GPTArch) -> list[tuple[str, torch.Tensor]]:
    """HF (name, tensor) pairs of one full Megatron weight (the fused ones split apart)."""
    if name in _TOP:
        return [(_TOP[name], tensor)]
    m = _LAYER.fullmatch(name)
    if m is None:
        raise ConversionError(f"{name!r} is not a weight of a Megatron GPT model")
    prefix, suffix = f"model.layers.{m.group(1)}.", m.group(2)
    if suffix in _SIMPLE:
        return [(prefix + _SIMPLE[suffix], tensor)]
    if suffix.startswith("self_attention.linear_qkv."):
        kind = suffix.rsplit(".", 1)[1]
        q, k, v = _qkv_split(tensor, arch)
        return [
            (f"{prefix}self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v), strict=True)
        ]
    if suffix == "mlp.linear_fc1.weight":
        gate, up = tensor.chunk(2, dim=0)
        return [(prefix + "mlp.gate_proj.weight", gate), (prefix + "mlp.up_proj.weight", up)]
    if suffix == "mlp.router.weight":
        return [(prefix + "mlp.gate.weight", tensor)]
    if (e := _EXPERT.fullmatch(suffix)) is not None:
        hf_e = f"{prefix}mlp.experts.{e.group(2)}."
        if e.group(3) == ".linear_fc2.weight":
            return [(hf_e + "down_proj.weight", tensor)]
        gate, up = tensor.chunk(2, dim=0)
        return [(hf_e + "gate_proj.weight", gate), (hf_e + "up_proj.weight", up)]
    raise ConversionError(f"{name!r} has no HF counterpart")


def megatron_to_hf(
    megatron: Mapping[str, torch.Tensor], arch: GPTArch
) -> Iterator[tuple[str, torch.Tensor]]:
    """HF (name, tensor) pairs of a full Megatron state dict, in its order."""
    for name, tensor in megatron.items():
        yield from to_hf(name, tensor, arch)


def expert_to_global(name: str, ep_rank: int, experts_per_rank: int) -> str:
    """The full-state-dict name of a rank's parameter: ``local_experts.{i}`` becomes the global
    expert index under expert parallelism; any other name is returned as is."""
    m = _EXPERT.fullmatch(name)
    if m is None:
        return name
    return f"{m.group(1)}{ep_rank * experts_per_rank + int(m.group(2))}{m.group(3)}"


def is_expert(name: str) -> bool:
    """Whether a Megatron parameter belongs to one expert (split over expert-parallel ranks)."""
    return _EXPERT.fullmatch(name) is not None


def tp_split_dim(name: str) -> int | None:
    """The dimension a Megatron weight is split along under TP (None: replicated)."""
    suffix = m.group(2) if (m := _LAYER.fullmatch(name)) else name
    if suffix in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return 0
    if suffix in _COLUMN or suffix == "mlp.linear_fc1.weight":
        return 0
    if suffix in _ROW:
        return 1
    return None


def tp_split_stride(name: str) -> int:
    """Megatron's ``partition_stride`` of a split weight: 2 for ``linear_fc1``, whose pieces
    are ``[gate_r; up_r]`` (two strided blocks per rank), else 1."""
    return 2 if name.endswith("mlp.linear_fc1.weight") else 1


def shard(name: str, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s piece of a full Megatron weight under ``tp``-way tensor parallelism."""
    import torch

    dim = tp_split_dim(name)
    if dim is None or tp == 1:
        return full
    if full.shape[dim] % tp:
        raise ConversionError(f"{name!r} has {full.shape[dim]} rows/columns, not divisible by {tp}")
    if name.endswith("mlp.linear_fc1.weight"):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
    return full.chunk(tp, dim=dim)[rank].contiguous()


def unshard(name: str, pieces: list[torch.Tensor]) -> torch.Tensor:
    """The full weight from every rank's piece, in rank order (inverse of :func:`shard`)."""
    import torch

    dim = tp_split_dim(name)
    if dim is None or len(pieces) == 1:
        return pieces[0]
    if name.endswith("mlp.linear_fc1.weight"):
        halves = [p.chunk(2, dim=0) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(pieces, dim=dim)


def shard_state_dict(
    full: Mapping[str, torch.Tensor], tp: int, rank: int
) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s state dict of a full Megatron state dict."""
    return {name: shard(name, t, tp, rank) for name, t in full.items()}


def unshard_state_dicts(shards: list[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The full Megatron state dict from every TP rank's state dict, in rank order."""
    names = list(shards[0])
    for r, s in enumerate(shards):
        if list(s) != names:
            raise ConversionError(f"TP rank {r}'s state dict has other names than rank 0's")
    return {name: unshard(name, [s[name] for s in shards]) for name in names}
