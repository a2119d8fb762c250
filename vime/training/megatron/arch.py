"""The shape of a Llama / Qwen2 / Qwen3 (dense) or Qwen3-MoE model, read from its HF config.

One typed record (:class:`GPTArch`) feeds both the Megatron model builder and the weight
converter, so the two can never disagree about head counts, biases or tied embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vime.errors import ConfigError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe")


@dataclass(frozen=True)
class GPTArch:
    """Everything the builder and the converter need to know about a decoder.

    ``num_experts`` is 0 for a dense model; a mixture-of-experts model has an MoE block in
    every layer, each expert a SwiGLU MLP of width ``moe_ffn_hidden_size``.
    """

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    rope_theta: float
    norm_eps: float
    qkv_bias: bool
    qk_norm: bool
    tied_embeddings: bool
    max_position_embeddings: int
    rope_scaling_factor: float | None = None
    num_experts: int = 0
    moe_topk: int = 0
    moe_ffn_hidden_size: int = 0
    # True: softmax over the chosen experts' logits (HF norm_topk_prob); False: the full
    # softmax's probabilities of the chosen experts, unnormalised.
    moe_norm_topk_prob: bool = True

    @property
    def is_moe(self) -> bool:
        """Whether the MLPs are mixtures of experts."""
        return self.num_experts > 0

    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one key/value head (GQA)."""
        return self.num_heads // self.num_kv_heads

    def check_expert_parallel(self, ep: int) -> None:
        """Raise ``ConfigError`` when the experts cannot be split over ``ep`` ranks."""
        if ep > 1 and not self.is_moe:
            raise ConfigError(
                f"--expert-model-parallel-size {ep} needs a mixture-of-experts model; "
                f"{self.model_type} is dense"
            )
        if self.is_moe and self.num_experts % ep:
            raise ConfigError(
                f"--expert-model-parallel-size {ep} does not divide the model's "
                f"{self.num_experts} experts; choose a size that divides {self.num_experts}"
            )

    def check_tensor_parallel(self, tp: int) -> None:
        """Raise ``ConfigError`` when this model cannot be split ``tp`` ways."""
        for what, n in (
            ("query heads", self.num_heads),
            ("key/value heads", self.num_kv_heads),
            ("FFN width", self.moe_ffn_hidden_size if self.is_moe else self.ffn_hidden_size),
            ("vocabulary", self.vocab_size),
        ):
            if n % tp:
                raise ConfigError(
                    f"--tensor-model-parallel-size {tp} does not divide the model's {what} "
                    f"({n}); choose a size that divides {n}"
                )

    @property
    def num_parameters(self) -> int:
        """Parameter count (tied embeddings counted once)."""
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_heads * d, self.num_kv_heads * d
        attn = h * (q + 2 * kv) + q * h + (q + 2 * kv if self.qkv_bias else 0)
        attn += 2 * d if self.qk_norm else 0
        mlp = 3 * h * self.ffn_hidden_size
        if self.is_moe:
            mlp = self.num_experts * (3 * h * self.moe_ffn_hidden_size + h)  # experts + router
        per_layer = attn + mlp + 2 * h
        emb = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return self.num_layers * per_layer + emb + h


def _get(config: Any, name: str) -> Any:
    value = getattr(config, name, None)
    if value is None:
        raise ConfigError(f"the HF config ({config.model_type}) has no {name!r}")
    return value


def _rope(config: Any) -> tuple[float, float | None]:
    """(theta, llama3 scaling factor or None) from transformers' ``rope_parameters``."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ConfigError("the HF config has no rope_theta")
    kind = params.get("rope_type", "default")
    if kind == "default":
        return float(theta), None
    # Megatron's built-in scaling is Llama 3.1's with these fixed constants.
    expected = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
    expected["original_max_position_embeddings"] = 8192
    if kind == "llama3" and all(params.get(k) == v for k, v in expected.items()):
        return float(theta), float(params["factor"])
    raise ConfigError(
        f"rope scaling {params!r} is not supported by the Megatron backend (plain RoPE and "
        "Llama 3.1 scaling with factors 1/4 and 8192 original positions are); use the torch "
        "backend for this model"
    )


def _moe(config: Any) -> dict[str, Any]:
    """The MoE fields of a Qwen3-MoE config; refuses layouts with dense layers between."""
    mlp_only = list(getattr(config, "mlp_only_layers", None) or [])
    step = getattr(config, "decoder_sparse_step", 1)
    if mlp_only or step != 1:
        raise ConfigError(
            f"qwen3_moe with mlp_only_layers={mlp_only} and decoder_sparse_step={step} mixes "
            "dense and MoE layers, which the Megatron backend does not build; it needs an MoE "
            "block in every layer (mlp_only_layers=[] and decoder_sparse_step=1)"
        )
    num_experts = _get(config, "num_experts")
    topk = _get(config, "num_experts_per_tok")
    if not 0 < topk <= num_experts:
        raise ConfigError(f"num_experts_per_tok {topk} must be in [1, num_experts={num_experts}]")
    return {
        "num_experts": int(num_experts),
        "moe_topk": int(topk),
        "moe_ffn_hidden_size": int(_get(config, "moe_intermediate_size")),
        "moe_norm_topk_prob": bool(getattr(config, "norm_topk_prob", False)),
    }


def arch_from_hf_config(config: Any) -> GPTArch:
    """Read and validate a transformers ``PretrainedConfig`` of a Llama/Qwen2/Qwen3(-MoE) model."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"model_type {model_type!r} is not supported by the Megatron backend; it builds "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} models"
        )
    if getattr(config, "mlp_bias", False):
        raise ConfigError("mlp_bias=True is not supported by the Megatron backend")
    if model_type in ("llama", "qwen3", "qwen3_moe") and getattr(config, "attention_bias", False):
        raise ConfigError(
            f"{model_type} with attention_bias=True (a biased o_proj) is not supported by the "
            "Megatron backend"
        )
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act {config.hidden_act!r} is not supported (only silu)")
    num_heads = _get(config, "num_attention_heads")
    num_kv = getattr(config, "num_key_value_heads", None) or num_heads
    hidden = _get(config, "hidden_size")
    head_dim = getattr(config, "head_dim", None) or hidden // num_heads
    if num_heads % num_kv:
        raise ConfigError(
            f"num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv}"
        )
    theta, factor = _rope(config)
    moe = _moe(config) if model_type == "qwen3_moe" else {}
    return GPTArch(
        model_type=model_type,
        num_layers=_get(config, "num_hidden_layers"),
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv,
        head_dim=head_dim,
        ffn_hidden_size=_get(config, "intermediate_size"),
        vocab_size=_get(config, "vocab_size"),
        rope_theta=theta,
        norm_eps=float(_get(config, "rms_norm_eps")),
        qkv_bias=model_type == "qwen2",
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        max_position_embeddings=int(getattr(config, "max_position_embeddings", 4096)),
        rope_scaling_factor=factor,
        **moe,
    )
