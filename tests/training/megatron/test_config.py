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


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], (None, None, None, None, None)),
        (["--bias-swiglu-fusion"], (True, None, None, None, None)),
        (["--no-bias-swiglu-fusion", "--no-rope-fusion"], (False, False, None, None, None)),
        (["--apply-rope-fusion", "--gradient-accumulation-fusion"], (None, True, True, None, None)),
        (["--no-gradient-accumulation-fusion"], (None, None, False, None, None)),
        (["--rms-norm-fusion"], (None, None, None, True, None)),
        (["--no-rms-norm-fusion"], (None, None, None, False, None)),
        (["--optimizer-fusion"], (None, None, None, None, True)),
        (["--no-optimizer-fusion", "--bf16"], (None, None, None, None, False)),
    ],
)
def test_fusion_flags_turn_each_fusion_on_or_off(args, expected, monkeypatch):
    cfg = parse_megatron_args(args)
    names = ("bias_swiglu", "apply_rope", "gradient_accumulation", "rms_norm", "optimizer")
    assert tuple(getattr(cfg, f"{n}_fusion") for n in names) == expected
    for cuda in (False, True):  # unset means: on with CUDA
        monkeypatch.setattr("torch.cuda.is_available", lambda cuda=cuda: cuda)
        for name, value in zip(names, expected, strict=True):
            assert cfg.fused(name) is (cuda if value is None else value), (name, cuda)


def test_the_optimizer_fusion_is_off_with_the_distributed_optimizer(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert not parse_megatron_args(["--use-distributed-optimizer"]).fused("optimizer")
    assert parse_megatron_args(["--bf16"]).fused("optimizer")
    with pytest.raises(ConfigError, match="--optimizer-fusion covers the non-distributed"):
        parse_megatron_args(["--optimizer-fusion", "--use-distributed-optimizer"])


@pytest.mark.parametrize(
    ("args", "off_cuda", "on_cuda"),
    [
        ([], False, True),  # on where the RMSNorm and RoPE fusions are: with CUDA
        (["--no-rms-norm-fusion"], False, False),
        (["--no-rope-fusion"], False, False),
        (["--no-qk-norm-rope-fusion"], False, False),
        (["--qk-norm-rope-fusion"], True, True),  # asked for: also on the CPU (interpreter)
        (["--qk-norm-rope-fusion", "--rms-norm-fusion", "--apply-rope-fusion"], True, True),
    ],
)
def test_the_qk_norm_rope_fusion_follows_the_norm_and_rope_fusions(
    args, off_cuda, on_cuda, monkeypatch
):
    cfg = parse_megatron_args(args)
    for cuda, expected in ((False, off_cuda), (True, on_cuda)):
        monkeypatch.setattr("torch.cuda.is_available", lambda cuda=cuda: cuda)
        assert cfg.fused("qk_norm_rope") is expected, cuda


@pytest.mark.parametrize("off", ["--no-rms-norm-fusion", "--no-rope-fusion"])
def test_the_qk_norm_rope_fusion_refuses_a_contradiction(off):
    with pytest.raises(ConfigError, match="contradicts --no-rms-norm-fusion and --no-rope"):
        parse_megatron_args(["--qk-norm-rope-fusion", off])


@pytest.mark.parametrize("fused", [True, False])
def test_the_qk_norm_rope_flag_picks_the_attention_module(fused):
    from megatron.core.transformer.attention import SelfAttention

    from vime.training.megatron.model import layer_spec
    from vime.training.megatron.qk_fusion import QKFusedSelfAttention

    spec = layer_spec(_tiny_arch(num_layers=2), fused_qk=fused)
    for layer in spec.layer_specs:
        module = layer.submodules.self_attention.module
        assert module is (QKFusedSelfAttention if fused else SelfAttention)


def test_the_model_config_takes_the_fusions(monkeypatch):
    from megatron.core.models.common.embeddings import rope_utils

    from vime.training.megatron import fusions
    from vime.training.megatron.model import transformer_config

    arch = _tiny_arch(num_layers=1)
    on = transformer_config(arch, parse_megatron_args(["--apply-rope-fusion",
        "--gradient-accumulation-fusion", "--bias-swiglu-fusion"]), initialize=False)  # fmt: skip
    assert (on.apply_rope_fusion, on.gradient_accumulation_fusion) == (True, True)
    assert on.bias_activation_fusion
    assert rope_utils.fused_apply_rotary_pos_emb is fusions.fused_apply_rotary_pos_emb
    off = transformer_config(arch, parse_megatron_args(UNFUSED), initialize=False)
    assert not (off.apply_rope_fusion or off.gradient_accumulation_fusion)
    assert not off.bias_activation_fusion


UNFUSED = ["--no-bias-swiglu-fusion", "--no-rope-fusion", "--no-gradient-accumulation-fusion"]


@pytest.mark.parametrize("fused", [True, False])
def test_rms_norm_flag_reaches_every_norm_of_the_layer_spec(fused):
    from megatron.core.transformer.spec_utils import ModuleSpec

    from vime.training.megatron.model import RMSNorm, layer_spec

    arch = _tiny_arch(num_layers=2)
    spec = layer_spec(arch, fused_norm=fused)
    layer = spec.layer_specs[0].submodules
    attention = layer.self_attention.submodules
    norms = [spec.layer_norm, layer.input_layernorm, layer.pre_mlp_layernorm]
    norms += [attention.q_layernorm, attention.k_layernorm]
    for norm in norms:
        assert isinstance(norm, ModuleSpec) and norm.module is RMSNorm
        assert norm.params == {"fused": fused}


def _tiny_arch(num_layers: int) -> object:
    """A tiny Qwen3-shaped arch (query/key norms on) for building configs and specs."""
    from vime.training.megatron.arch import GPTArch

    return GPTArch(
        model_type="qwen3", num_layers=num_layers, hidden_size=64, num_heads=2, num_kv_heads=1,
        head_dim=32, ffn_hidden_size=128, vocab_size=96, rope_theta=1e4, norm_eps=1e-6,
        qkv_bias=False, qk_norm=True, tied_embeddings=True, max_position_embeddings=64,
    )  # fmt: skip
