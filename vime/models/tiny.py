"""Tiny random Llama/Qwen-style models with SmolLM2's tokenizer, for fast real-engine tests.

They load in vLLM and transformers like any HF checkpoint, generate garbage quickly, and
differ by seed, so a weight update to another seed visibly changes greedy output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from vime.errors import ConfigError
from vime.models.tokenizer import copy_tokenizer, smollm2_tokenizer_dir

Family = Literal["llama", "qwen2", "qwen3"]
FAMILIES: tuple[str, ...] = ("llama", "qwen2", "qwen3")
HEAD_DIM = 32


def _config(family: str, num_layers: int, hidden_size: int, vocab_size: int, ids: dict):
    """The transformers config of a tiny model of ``family``."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    # vLLM's CPU attention supports head sizes 32, 64, 80, ...; 32 keeps the model tiny.
    heads = hidden_size // HEAD_DIM
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2) if heads % 2 == 0 else heads,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        # A larger init than the usual 0.02 keeps logits far from flat, so greedy decoding
        # is stable and different seeds give clearly different outputs.
        initializer_range=0.2,
    )
    if family == "llama":
        return LlamaConfig(**common, head_dim=HEAD_DIM)
    if family == "qwen2":
        return Qwen2Config(**common)
    return Qwen3Config(**common, head_dim=HEAD_DIM)


def build_tiny_model(
    out_dir: str | Path,
    family: Family = "llama",
    num_layers: int = 2,
    hidden_size: int = 64,
    seed: int = 0,
) -> Path:
    """Write a random ``family`` model with SmolLM2's tokenizer into ``out_dir``; return it.

    The folder holds ``model.safetensors`` (fp32), ``config.json``, ``generation_config.json``,
    the tokenizer files and the chat template. The same arguments give the same weights.
    """
    if family not in FAMILIES:
        raise ConfigError(f"unknown tiny model family {family!r}; choose one of {FAMILIES}")
    if num_layers < 1:
        raise ConfigError(f"num_layers must be at least 1, got {num_layers}")
    if hidden_size < HEAD_DIM or hidden_size % HEAD_DIM:
        raise ConfigError(
            f"hidden_size must be a positive multiple of {HEAD_DIM} (the head size vLLM's CPU "
            f"attention supports), got {hidden_size}"
        )
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = json.loads((smollm2_tokenizer_dir() / "tokenizer_config.json").read_text())
    vocab = json.loads((smollm2_tokenizer_dir() / "tokenizer.json").read_text())
    token_ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    ids = {k: token_ids[tok[f"{k}_token"]] for k in ("bos", "eos", "pad")}
    vocab_size = max(len(vocab["model"]["vocab"]), max(token_ids.values()) + 1)
    config = _config(family, num_layers, hidden_size, vocab_size, ids)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = ids["eos"]
    model.save_pretrained(str(out))
    copy_tokenizer(out)
    return out
