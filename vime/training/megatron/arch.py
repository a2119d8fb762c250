"""The shape of a Llama / Qwen2 / Qwen3 dense model, read from its HF config and validated.

One typed record (:class:`GPTArch`) feeds both the Megatron model builder and the weight
converter, so the two can never disagree about head counts, biases or tied embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vime.errors import ConfigError

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class GPTArch:
    """Everything the builder and the converter need to know about a dense decoder."""

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

    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one key/value head (GQA)."""
        return self.num_heads // self.num_kv_heads

    def check_tensor_parallel(self, tp: int) -> None:
        """Raise ``ConfigError`` when this model cannot be split ``tp`` ways."""
        for what, n in (
            ("query heads", self.num_heads),
            ("key/value heads", self.num_kv_heads),
            ("FFN width", self.ffn_hidden_size),
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


def arch_from_hf_config(config: Any) -> GPTArch:
    """Read and validate a transformers ``PretrainedConfig`` of a Llama/Qwen2/Qwen3 model."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"model_type {model_type!r} is not supported by the Megatron backend; it builds "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} dense models"
        )
    if getattr(config, "mlp_bias", False):
        raise ConfigError("mlp_bias=True is not supported by the Megatron backend")
    if model_type in ("llama", "qwen3") and getattr(config, "attention_bias", False):
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
        qk_norm=model_type == "qwen3",
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        max_position_embeddings=int(getattr(config, "max_position_embeddings", 4096)),
        rope_scaling_factor=factor,
    )
