"""Megatron self-attention whose query/key norms and RoPE run in one kernel each way
(``--qk-norm-rope-fusion``).

megatron-core's ``SelfAttention`` splits the QKV projection's output into views, copies the
query into head order, applies ``q_layernorm`` and ``k_layernorm``, then rotates the query and
the key in ``apply_rotary_pos_emb``: on Qwen3 five launches a layer forward and more backward,
each paying the host's launch cost (the 1.7B step waits on the host). :class:`QKFusedSelfAttention`
takes the rotary embedding out of megatron's path and produces the query, key and value from the
projection's output with :func:`vime.training.kernels.qk_norm_rope.split_norm_rope`. The layer
keeps megatron's modules and parameter names (``q_layernorm.weight`` stays where checkpoints and
the converter expect it); only the kernels change.

Anything the kernel does not cover goes through megatron-core's own code unchanged: no Triton
here (the CPU without the interpreter), inference, cross attention, context parallelism, tensor
parallelism wider than the key/value heads, gated attention, interleaved or partial rotation,
YaRN's scaled attention, per-layer ``no_rope``, or norms other than Vime's RMSNorm.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.transformer.attention import SelfAttention

from vime.training.kernels import qk_norm_rope
from vime.training.megatron.fusions import rope_angles


class QKFusedSelfAttention(SelfAttention):
    """megatron-core's ``SelfAttention`` with its query/key norms and RoPE fused."""

    _pending: tuple[torch.Tensor, Any] | None = None  # (freqs, packed_seq_params) of a forward

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        key_value_states: torch.Tensor | None = None,
        inference_context: Any = None,
        rotary_pos_emb: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """megatron-core's forward; the rotation moves into :meth:`get_query_key_value_tensors`
        when the fused kernel takes this call."""
        freqs = self._fusable(
            hidden_states, key_value_states, inference_context, rotary_pos_emb, kwargs
        )
        if freqs is None:
            return super().forward(hidden_states, attention_mask, key_value_states,
                                   inference_context, rotary_pos_emb, *args, **kwargs)  # fmt: skip
        self._pending = (freqs, kwargs.get("packed_seq_params"))
        try:
            # No rotary embedding for megatron's own path: the query and key come rotated.
            return super().forward(hidden_states, attention_mask, key_value_states,
                                   inference_context, None, *args, **kwargs)  # fmt: skip
        finally:
            self._pending = None

    def _fusable(
        self,
        hidden_states: torch.Tensor,
        key_value_states: Any,
        inference_context: Any,
        rotary_pos_emb: Any,
        kwargs: dict[str, Any],
    ) -> torch.Tensor | None:
        """The rotary frequencies when the fused kernel covers this call, else None."""
        if (
            rotary_pos_emb is None
            or key_value_states is not None
            or inference_context is not None
            or kwargs.get("inference_params") is not None
            or not self._layer_fusable()
            or not qk_norm_rope.available(hidden_states)
        ):
            return None
        if isinstance(rotary_pos_emb, tuple):
            q_freqs, k_freqs = rotary_pos_emb
            if q_freqs is not k_freqs:
                return None
            rotary_pos_emb = q_freqs
        if rotary_pos_emb.shape[-1] != self.hidden_size_per_attention_head:
            return None  # a partial rotation
        packed = kwargs.get("packed_seq_params")
        if packed is not None and packed.qkv_format != "thd":
            return None
        return rotary_pos_emb

    def _layer_fusable(self) -> bool:
        """Whether this layer's configuration is one the kernel computes (fixed once built)."""
        known = self.__dict__.get("_vime_layer_fusable")
        if known is None:
            config = self.config
            norms = (_norm_weight(self.q_layernorm), _norm_weight(self.k_layernorm))
            cp = getattr(getattr(self, "pg_collection", None), "cp", None)
            # getattr: options a megatron-core version may not have are off there
            known = not (
                getattr(config, "no_rope_freq", None)
                or getattr(config, "attention_output_gate", False)
                or getattr(config, "rotary_interleaved", False)
                or config.num_query_groups < self.world_size
                or (cp is not None and cp.size() != 1)
                or _mscale(config) != 1.0
                or any(w is False for w in norms)
                or (norms[0] is None) != (norms[1] is None)
                or (norms[0] is not None and self.q_layernorm.eps != self.k_layernorm.eps)
            )
            self.__dict__["_vime_layer_fusable"] = known
        return known

    def get_query_key_value_tensors(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        output_gate: bool = False,
        split_qkv: bool = True,
    ) -> Any:
        """Query and key normalised and rotated, and the value, as megatron's
        ``[sq, b, heads, head_dim]`` tensors, from one kernel when :meth:`forward` set it up."""
        if self._pending is None or output_gate or not split_qkv:
            return super().get_query_key_value_tensors(
                hidden_states, key_value_states, output_gate=output_gate, split_qkv=split_qkv
            )
        freqs, packed = self._pending
        mixed_qkv, _ = self.linear_qkv(hidden_states)
        sq, b = mixed_qkv.shape[:2]
        groups = self.num_query_groups_per_partition
        per_group = self.num_attention_heads_per_partition // groups
        dim = self.hidden_size_per_attention_head
        cu_seqlens = None
        if packed is not None:
            cu_seqlens = packed.cu_seqlens_q_padded
            cu_seqlens = packed.cu_seqlens_q if cu_seqlens is None else cu_seqlens
        angles, positions = rope_angles(freqs, sq, b, cu_seqlens)
        q_weight, k_weight = _norm_weight(self.q_layernorm), _norm_weight(self.k_layernorm)
        eps = self.q_layernorm.eps if q_weight is not None else 0.0
        query, key, value = qk_norm_rope.split_norm_rope(
            mixed_qkv.reshape(sq * b, groups, -1), per_group, q_weight, k_weight, eps, angles,
            positions,
        )  # fmt: skip
        return (
            query.view(sq, b, groups * per_group, dim),
            key.view(sq, b, groups, dim),
            value.view(sq, b, groups, dim),
        )


def _norm_weight(module: Any) -> Any:
    """A query/key norm's weight for the kernel: None without a norm, False for a norm the
    kernel does not compute (anything but Vime's bias-free RMSNorm)."""
    from megatron.core.transformer.identity_op import IdentityOp

    from vime.training.megatron.model import RMSNorm

    if module is None or isinstance(module, IdentityOp):
        return None
    if type(module) is not RMSNorm:
        return False
    return module.weight


def _mscale(config: Any) -> float:
    """megatron-core's attention scaling of the rotary embedding (YaRN), 1.0 otherwise."""
    from megatron.core.transformer import attention

    factor = getattr(attention, "_yarn_get_concentration_factor_from_config", None)
    return 1.0 if factor is None else float(factor(config))
