"""bench/train_mfu.py --backends: every variant is checked before anything is measured, so a
misspelt or retired option cannot silently measure the default path under its name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_known_variants_pass(train_mfu):
    backends = (
        "plain,megatron+export,megatron+no-qk-norm-rope,torch+autocast+pack4,torch+no-hf-rope,"
        "torch+no-share-prompts,torch+no-hf-gradient-accumulation"
    )
    assert train_mfu.check_variants(backends) == backends.split(",")


@pytest.mark.parametrize(
    ("backends", "message"),
    [
        (
            "torch+weight-copy",
            r"unknown option 'weight-copy' \(the bf16 weight copy is the torch "
            r"backend's default on a GPU now; torch\+autocast",
        ),
        ("torch+profle", r"unknown option 'profle' \(see --help"),
        ("trch", r"names backend 'trch'; known: plain, megatron, torch"),
        ("megatron+autocast", r"autocast is a torch backend option"),
        (
            "torch+no-qk-norm-rope",
            r"the torch backend's no-NAME options are no-share-prompts, no-output-softmax",
        ),
        ("torch+pack0", r"unknown option 'pack0'"),
        ("megatron+flash+cudnn", r"cudnn and flash are two attention choices; pick one"),
        ("", r"names backend ''"),
    ],
)
def test_unknown_variants_are_refused(train_mfu, backends, message):
    with pytest.raises(SystemExit, match=message):
        train_mfu.check_variants(backends)


def test_a_refused_variant_stops_the_run_before_the_gpu_is_touched(tmp_path):
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(BENCH / "train_mfu.py"), "--backends", "plain,torch+weight-copy"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "unknown option 'weight-copy'" in proc.stderr
    assert "matmul" not in proc.stdout


def _child(train_mfu, variant: str) -> dict[str, str]:
    import argparse

    args = argparse.Namespace(seq_len=4096, samples=2, warmup=2, steps=4, megatron_args="")
    cmd = train_mfu.child_command(args, "qwen3-4b", variant)
    return dict(a[2:].split("=", 1) for a in cmd if a.startswith("--") and "=" in a)


def test_variant_options_reach_the_child_as_trainer_and_megatron_flags(train_mfu):
    assert _child(train_mfu, "torch+no-share-prompts")["trainer-off"] == "share_prompts"
    assert _child(train_mfu, "torch")["trainer-off"] == ""
    off = _child(train_mfu, "torch+no-hf-gradient-accumulation")["trainer-off"]
    assert off == "hf_gradient_accumulation_fusion"
    # unfused turns off the fusions, never the packing
    unfused = _child(train_mfu, "torch+unfused")["trainer-off"].split(",")
    assert unfused == sorted(train_mfu.TRAINER_FUSIONS.values())
    assert "share_prompts" not in unfused
    megatron = _child(train_mfu, "megatron+no-rms-norm+flash")
    assert megatron["megatron-args"] == " --no-rms-norm-fusion"
    assert megatron["trainer-off"] == "" and megatron["sdpa"] == "flash"


def test_models_take_a_layer_count_and_refuse_unknown_shapes(train_mfu):
    sys.path.insert(0, str(BENCH))
    from qwen3_shapes import qwen3_config

    assert train_mfu.check_models("qwen3-1.7b,qwen3-4b@24") == ["qwen3-1.7b", "qwen3-4b@24"]
    cut, full = qwen3_config("qwen3-4b@24"), qwen3_config("qwen3-4b")
    assert cut.num_hidden_layers == 24 and full.num_hidden_layers == 36
    assert cut.hidden_size == full.hidden_size == 2560  # every other field is the 4B model's
    assert cut.intermediate_size == full.intermediate_size and cut.tie_word_embeddings
    for bad, message in [
        ("qwen3-5b", r"unknown shape 'qwen3-5b'; choose one of"),
        ("qwen3-4b@0", r"from 1 to qwen3-4b's 36"),
        ("qwen3-4b@37", r"from 1 to qwen3-4b's 36"),
        ("qwen3-4b@x", r"must be a whole number"),
    ]:
        with pytest.raises(SystemExit, match=message):
            train_mfu.check_models(bad)
