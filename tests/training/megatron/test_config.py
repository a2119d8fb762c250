"""Megatron's own flags parsed into MegatronConfig, with clear errors."""

from __future__ import annotations

import pytest

from vime.errors import ConfigError
from vime.training.megatron.config import MegatronConfig, parse_megatron_args


def test_typical_flags_are_parsed():
    cfg = parse_megatron_args(
        [
            "--tensor-model-parallel-size", "2",
            "--use-distributed-optimizer",
            "--bf16",
            "--recompute-granularity", "full",
            "--recompute-method", "uniform",
            "--recompute-num-layers", "1",
        ]
    )  # fmt: skip
    assert cfg == MegatronConfig(
        tensor_model_parallel_size=2,
        use_distributed_optimizer=True,
        bf16=True,
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=1,
    )


def test_no_flags_give_the_defaults():
    assert parse_megatron_args([]) == MegatronConfig()


def test_recompute_activations_means_selective():
    assert parse_megatron_args(["--recompute-activations"]).recompute_granularity == "selective"


def test_unknown_flag_is_named():
    with pytest.raises(ConfigError, match="unrecognized Megatron flag '--num-experts'"):
        parse_megatron_args(["--num-experts", "8"])


def test_bad_value_is_a_config_error():
    with pytest.raises(ConfigError, match="--tensor-model-parallel-size"):
        parse_megatron_args(["--tensor-model-parallel-size", "two"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fp16"], "--fp16 is not supported"),
        (["--sequence-parallel"], "--sequence-parallel"),
        (["--context-parallel-size", "2"], "--context-parallel-size 2"),
        (["--pipeline-model-parallel-size", "0"], "must be >= 1"),
        (["--tensor-model-parallel-size", "0"], "must be >= 1"),
        (["--recompute-granularity", "full"], "needs --recompute-method"),
        (["--recompute-method", "block"], "apply only with --recompute-granularity full"),
        (
            ["--recompute-activations", "--recompute-granularity", "full"],
            "contradicts --recompute-granularity full",
        ),
    ],
)
def test_unsupported_or_contradictory_flags_are_refused(args, message):
    with pytest.raises(ConfigError, match=message):
        parse_megatron_args(args)


def test_world_size_must_split_into_model_replicas():
    cfg = MegatronConfig(tensor_model_parallel_size=2)
    assert cfg.data_parallel_size(4) == 2
    with pytest.raises(ConfigError, match="3 processes cannot be split"):
        cfg.data_parallel_size(3)


def test_moe_flags_are_parsed():
    cfg = parse_megatron_args(["--expert-model-parallel-size", "2", "--moe-aux-loss-coeff", "0.01"])
    assert (cfg.expert_model_parallel_size, cfg.moe_aux_loss_coeff) == (2, 0.01)
    assert cfg.data_parallel_size(2) == 2
    with pytest.raises(ConfigError, match="--expert-model-parallel-size 2 must divide the 3"):
        cfg.data_parallel_size(3)
    with pytest.raises(ConfigError, match=r"--moe-aux-loss-coeff -1\.0 must be >= 0"):
        parse_megatron_args(["--moe-aux-loss-coeff", "-1"])
