"""The SmolLM2 tokenizer and chat template, extracted from the GGUF once and cached.

Reading only the tokenizer from the GGUF metadata takes seconds and never touches the weights,
so tiny test models can share SmolLM2's real vocabulary and template cheaply.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from vime.models.cache import atomic_dir, models_dir, smollm2_gguf_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def smollm2_tokenizer_dir() -> Path:
    """A folder holding SmolLM2's tokenizer files (built from the GGUF on first use)."""
    target = models_dir() / "smollm2-tokenizer"
    if (target / "tokenizer.json").is_file():
        return target
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with atomic_dir(target) as tmp:
        tokenizer.save_pretrained(str(tmp))
    return target


def copy_tokenizer(out_dir: Path) -> None:
    """Copy SmolLM2's tokenizer files into the model folder ``out_dir``."""
    src = smollm2_tokenizer_dir()
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, out_dir / name)
