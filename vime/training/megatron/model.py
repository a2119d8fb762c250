"""Megatron-core GPT models for Llama/Qwen2/Qwen3 and Qwen3-MoE built from a :class:`GPTArch`.

The layer spec uses megatron-core's own tensor-parallel linears only (no TransformerEngine, no
Apex) and swaps in two fast modules: attention through torch SDPA (flash / memory-efficient
kernels instead of materialising ``[b, heads, s, s]`` scores) and RMSNorm through
``torch.nn.functional.rms_norm``. MoE layers are megatron-core's own ``MoELayer`` with its
top-k router and local (unfused, one MLP per expert) experts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from vime.training.attention import causal_sdpa, packed_causal_sdpa
from vime.training.megatron.arch import GPTArch

if TYPE_CHECKING:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    from vime.training.megatron.config import MegatronConfig


class RMSNorm(torch.nn.Module):
    """RMSNorm with the signature Megatron's builders call (``config, hidden_size, eps``).

    ``fused``: the Triton kernels of :mod:`vime.training.kernels.rms_norm` where they run
    (CUDA), else torch's ``F.rms_norm``; with ``gradient_accumulation_fusion`` too, they add
    the weight's gradient straight into megatron's fp32 ``main_grad``.
    """

    def __init__(
        self, config: Any, hidden_size: int, eps: float = 1e-6, fused: bool = False, **_: Any
    ) -> None:
        super().__init__()
        self.eps = eps
        self.fused = fused
        self.weight = torch.nn.Parameter(
            torch.ones(hidden_size, dtype=config.params_dtype, device=_init_device(config))
        )
        if fused and config.gradient_accumulation_fusion:
            from vime.training.kernels import ACCUMULATE_MAIN_GRAD

            # The kernels add the weight's gradient to megatron's fp32 main_grad themselves,
            # as megatron's linears do with this fusion.
            setattr(self.weight, ACCUMULATE_MAIN_GRAD, True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise over the last dimension."""
        if self.fused:
            from vime.training.kernels.rms_norm import rms_norm

            return rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


def _init_device(config: Any) -> torch.device:
    if config.use_cpu_initialization or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


class SDPAttention(torch.nn.Module):
    """Causal core attention through ``torch.nn.functional.scaled_dot_product_attention``.

    Takes Megatron's layouts: ``[s, b, heads, dim]`` tensors, or ``[t, heads, dim]`` packed
    sequences (``thd``) whose bounds come in ``packed_seq_params.cu_seqlens_q``; each packed
    sequence attends only within itself. Returns ``[s, b, heads * dim]`` (``[t, heads * dim]``
    when packed).
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        **_: Any,
    ) -> None:
        super().__init__()
        self.config = config
        self.softmax_scale = softmax_scale
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        """Attention output, flattened over heads."""
        if attention_bias is not None:
            raise ValueError("SDPAttention does not take an attention bias")
        dropout = self.dropout if self.training else 0.0
        if packed_seq_params is not None:
            bounds = host_bounds(packed_seq_params)
            packed = (query[None], key[None], value[None])
            out = packed_causal_sdpa(*packed, bounds, dropout=dropout, scale=self.softmax_scale)
            return out[0].reshape(query.shape[0], -1)
        out = causal_sdpa(
            *(t.transpose(0, 1) for t in (query, key, value)),
            dropout=dropout,
            scale=self.softmax_scale,
        )
        return out.transpose(0, 1).reshape(query.shape[0], query.shape[1], -1)


def host_bounds(packed_seq_params: Any) -> list[int]:
    """The packed sequences' bounds as Python ints: those the trainer attached to the params
    (``vime_host_bounds``), else read from the device once and kept there, so the layers of
    a forward do not each wait for the GPU to read them."""
    bounds = getattr(packed_seq_params, "vime_host_bounds", None)
    if bounds is None:
        bounds = packed_seq_params.cu_seqlens_q.tolist()
        packed_seq_params.vime_host_bounds = bounds
    return bounds


def layer_spec(
    arch: GPTArch,
    num_layers: int | None = None,
    *,
    fused_norm: bool = False,
    fused_qk: bool = False,
) -> Any:
    """Megatron block spec of ``num_layers`` layers (default: all of ``arch``'s; a pipeline
    stage builds its share): local linears, :class:`SDPAttention`, :class:`RMSNorm` (its
    Triton kernels when ``fused_norm``), and with ``fused_qk`` the query/key norms and RoPE in
    one kernel each way (:class:`vime.training.megatron.qk_fusion.QKFusedSelfAttention`)."""
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
    from megatron.core.transformer.transformer_layer import (
        TransformerLayer,
        TransformerLayerSubmodules,
    )

    norm = ModuleSpec(module=RMSNorm, params={"fused": fused_norm})
    qk_norm = norm if arch.qk_norm else IdentityOp
    attention = SelfAttention
    if fused_qk:
        from vime.training.megatron.qk_fusion import QKFusedSelfAttention

        attention = QKFusedSelfAttention
    layer = ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=norm,
            self_attention=ModuleSpec(
                module=attention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=ColumnParallelLinear,
                    core_attention=SDPAttention,
                    linear_proj=RowParallelLinear,
                    q_layernorm=qk_norm,
                    k_layernorm=qk_norm,
                ),
            ),
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=norm,
            mlp=_moe_spec(arch)
            if arch.is_moe
            else ModuleSpec(
                module=MLP,
                submodules=MLPSubmodules(
                    linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear
                ),
            ),
            mlp_bda=get_bias_dropout_add,
        ),
    )
    count = arch.num_layers if num_layers is None else num_layers
    return TransformerBlockSubmodules(layer_specs=[layer] * count, layer_norm=norm)


def _moe_spec(arch: GPTArch) -> Any:
    """megatron-core's MoE layer: top-k router, one local MLP per expert (no grouped GEMM)."""
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        # megatron-core 0.16.1 defines it only when TransformerEngine imports, and its router's
        # gating linear then fails with NameError; None selects its plain torch matmul.
        moe_utils.te_general_gemm = None
    return get_moe_module_spec(use_te=False, num_experts=arch.num_experts, moe_grouped_gemm=False)


def _moe_options(arch: GPTArch, mcfg: MegatronConfig) -> dict[str, Any]:
    """``TransformerConfig`` fields of an MoE model (none for a dense one).

    HF Qwen3-MoE routes by softmax over all experts then top-k, renormalised when
    ``norm_topk_prob``. Megatron's softmax router without pre-softmax takes the top-k logits and
    softmaxes them, which is the renormalised form; with pre-softmax it keeps the full softmax's
    values, the unnormalised one.
    """
    if not arch.is_moe:
        return {}
    ep = mcfg.expert_model_parallel_size
    return {
        "num_moe_experts": arch.num_experts,
        "moe_ffn_hidden_size": arch.moe_ffn_hidden_size,
        "moe_router_topk": arch.moe_topk,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not arch.moe_norm_topk_prob,
        "moe_router_dtype": "fp32",
        "moe_router_load_balancing_type": "aux_loss",
        "moe_aux_loss_coeff": mcfg.moe_aux_loss_coeff,
        # All-gather needs equal token counts on every rank; data-parallel ranks that share
        # experts hold micro-batches of different lengths, which all-to-all handles.
        "moe_token_dispatcher_type": "alltoall" if ep > 1 else "allgather",
        "expert_model_parallel_size": ep,
    }


def transformer_config(arch: GPTArch, mcfg: MegatronConfig, *, initialize: bool) -> Any:
    """Megatron ``TransformerConfig`` of the model; ``initialize=False`` skips random init."""
    from megatron.core.transformer import TransformerConfig

    dtype = torch.bfloat16 if mcfg.bf16 else torch.float32
    rope_fusion, wgrad_fusion = mcfg.fused("apply_rope"), mcfg.fused("gradient_accumulation")
    from vime.training.megatron import fusions

    if rope_fusion or wgrad_fusion:
        fusions.install()  # before TransformerConfig: it checks that the RoPE kernel exists
    if mcfg.fused("bias_swiglu"):
        fusions.install_swiglu()
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=mcfg.bf16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        tensor_model_parallel_size=mcfg.tensor_model_parallel_size,
        pipeline_model_parallel_size=mcfg.pipeline_model_parallel_size,
        sequence_parallel=False,
        # SwiGLU: megatron-core's fused function (Triton math on CUDA); RoPE and weight-gradient
        # accumulation: our kernels (fusions.py). The others need TransformerEngine or Apex.
        bias_activation_fusion=mcfg.fused("bias_swiglu"),
        apply_rope_fusion=rope_fusion,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=wgrad_fusion,
        persist_layer_norm=False,
        recompute_granularity=mcfg.recompute_granularity,
        recompute_method=mcfg.recompute_method,
        recompute_num_layers=mcfg.recompute_num_layers,
        # Gradients are summed over data-parallel ranks; the loss carries the global normaliser.
        calculate_per_token_loss=True,
        use_cpu_initialization=not torch.cuda.is_available(),
        perform_initialization=initialize,
        init_method_std=0.02,
        **_moe_options(arch, mcfg),
    )


def build_gpt_model(arch: GPTArch, mcfg: MegatronConfig, *, initialize: bool = False) -> GPTModel:
    """This pipeline stage's Megatron ``GPTModel`` of ``arch`` (needs ``parallel_state``
    initialised): its share of the layers, the embedding on the first stage, the final norm
    and output layer on the last."""
    from megatron.core import parallel_state as mpu
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    config = transformer_config(arch, mcfg, initialize=initialize)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(
            arch,
            get_num_layers_to_build(config),
            fused_norm=mcfg.fused("rms_norm"),
            fused_qk=mcfg.fused("qk_norm_rope"),
        ),
        vocab_size=arch.vocab_size,
        max_sequence_length=arch.max_position_embeddings,
        pre_process=mpu.is_pipeline_first_stage(),
        post_process=mpu.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=arch.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=arch.rope_theta,
        rope_scaling=arch.rope_scaling_factor is not None,
        rope_scaling_factor=arch.rope_scaling_factor or 8.0,
    )
    mark_tensor_parallel(model)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    return model


def mark_tensor_parallel(model: torch.nn.Module) -> None:
    """Give every split weight megatron-core's tensor-parallel attributes.

    megatron-core sets them only while it initialises weights randomly; weights loaded from an
    HF checkpoint (``perform_initialization=False``) lack them, and its grad norm then counts
    them on TP rank 0 only (clipping by the wrong norm). The layout comes from the converter,
    which is what shards the weights.
    """
    from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

    from vime.training.megatron.convert import tp_split_dim, tp_split_stride

    for name, param in model.named_parameters():
        dim = tp_split_dim(name)
        if dim is None:
            continue
        if not hasattr(param, "tensor_model_parallel"):
            set_tensor_model_parallel_attributes(param, True, dim, tp_split_stride(name))
        elif (param.partition_dim, param.partition_stride) != (dim, tp_split_stride(name)):
            raise RuntimeError(
                f"{name}: Megatron splits it along dim {param.partition_dim} with stride "
                f"{param.partition_stride}, the converter along {dim} with stride "
                f"{tp_split_stride(name)}"
            )
