"""TrainerConfig: flags generated from the dataclass, contradictions rejected."""

from __future__ import annotations

import argparse

import pytest

from vime.config.schema import add_options, build
from vime.errors import ConfigError
from vime.training import create_trainer
from vime.training.base import TrainerConfig


def test_flags_use_megatron_names_and_build_the_config():
    parser = argparse.ArgumentParser()
    add_options(parser, TrainerConfig)
    args = parser.parse_args(
        ["--lr", "3e-5", "--lr-decay-style", "cosine", "--train-iters", "10", "--clip-grad", "0"]
    )
    cfg = build(TrainerConfig, args)
    assert (cfg.lr, cfg.lr_decay_style, cfg.train_iters, cfg.clip_grad) == (3e-5, "cosine", 10, 0)
    assert cfg.max_tokens_per_micro_batch == 8192


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(lr=-1.0), "--lr -1.0 must be >= 0"),
        (dict(lr=1e-3, min_lr=1e-2), "--min-lr 0.01 must be in"),
        (dict(adam_beta2=1.0), "--adam-beta2 1.0 must be in"),
        (dict(max_tokens_per_micro_batch=0), "--max-tokens-per-micro-batch 0 must be > 0"),
        (dict(lr_decay_style="cosine"), "--lr-decay-style cosine needs --train-iters"),
        (
            dict(lr_decay_style="linear", lr_warmup_iters=5, train_iters=5),
            r"greater than --lr-warmup-iters \(5\), got 5",
        ),
    ],
)
def test_contradictions_raise_config_error_naming_the_flag(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TrainerConfig(**kwargs)


def test_unknown_backend_is_rejected():
    cfg = TrainerConfig()
    cfg.backend = "jax"  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="--backend 'jax' is unknown"):
        create_trainer(cfg)
