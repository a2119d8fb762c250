"""Tiny random models: loadable HF folders with SmolLM2's tokenizer, deterministic by seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from vime.cli.main import main
from vime.errors import ConfigError
from vime.models.tiny import build_tiny_model


def _tensors(folder: Path) -> dict:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)


def test_tiny_folder_has_weights_config_tokenizer_and_chat_template(tiny_llama: Path) -> None:
    names = {p.name for p in tiny_llama.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= names
    config = json.loads((tiny_llama / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["hidden_size"]) == (2, 64)
    assert config["vocab_size"] == 49152
    assert config["eos_token_id"] == 2  # <|im_end|>, SmolLM2's end of turn


def test_tiny_tokenizer_renders_smollm2_chat_template(tiny_llama: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.convert_ids_to_tokens([1, 2]) == ["<|im_start|>", "<|im_end|>"]


def test_same_seed_gives_same_weights_and_other_seed_differs(
    tiny_llama: Path, tmp_path: Path
) -> None:
    again = _tensors(build_tiny_model(tmp_path / "same", seed=0))
    other = _tensors(build_tiny_model(tmp_path / "other", seed=1))
    first = _tensors(tiny_llama)
    assert set(first) == set(again) == set(other)
    assert all((first[k] == again[k]).all() for k in first)
    assert any(not (first[k] == other[k]).all() for k in first)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_families_generate_with_transformers(family: str, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(tmp_path / family, family=family, num_layers=1)
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert model.config.model_type == family
    out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 7)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"family": "gpt2"}, "unknown tiny model family 'gpt2'"),
        ({"num_layers": 0}, "num_layers must be at least 1, got 0"),
        ({"hidden_size": 48}, "hidden_size must be a positive multiple of 32 .* got 48"),
    ],
)
def test_bad_tiny_arguments_are_rejected(kwargs: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        build_tiny_model(tmp_path, **kwargs)


def test_cli_model_tiny_writes_the_folder_and_prints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli"
    assert main(["model", "tiny", "--out", str(out), "--family", "qwen3", "--num-layers", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3"
