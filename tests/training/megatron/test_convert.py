"""HF <-> Megatron weight conversion and TP sharding: exact round trips and layouts (pure CPU)."""

from __future__ import annotations

import pytest
import torch

from vime.errors import ConfigError
from vime.training.megatron.arch import arch_from_hf_config
from vime.training.megatron.convert import (
    ConversionError,
    expert_to_global,
    hf_to_megatron,
    megatron_to_hf,
    shard,
    shard_state_dict,
    to_hf,
    unshard_state_dicts,
)

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe")


def _hf_state(make_hf_config, family: str, **overrides) -> tuple[object, dict[str, torch.Tensor]]:
    """A random model's weights as its saved checkpoint names them (experts one by one)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = make_hf_config(family, **overrides)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # saved checkpoints hold the tied weight once
    return config, _unfuse_experts(state)


def _unfuse_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' fused in-memory expert tensors -> the per-expert names it saves."""
    out = {}
    for name, t in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name.removesuffix("gate_up_proj")
            for e, w in enumerate(t):
                gate, up = w.chunk(2)
                out[f"{prefix}{e}.gate_proj.weight"] = gate
                out[f"{prefix}{e}.up_proj.weight"] = up
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            for e, w in enumerate(t):
                out[f"{prefix}{e}.down_proj.weight"] = w
        else:
            out[name] = t
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_megatron_hf_round_trip_is_exact(make_hf_config, family):
    config, hf = _hf_state(make_hf_config, family)
    arch = arch_from_hf_config(config)
    back = dict(megatron_to_hf(hf_to_megatron(hf, arch), arch))
    assert sorted(back) == sorted(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


@pytest.mark.parametrize("family", FAMILIES)
def test_family_features_reach_the_megatron_names(make_hf_config, family):
    config, hf = _hf_state(make_hf_config, family)
    mg = hf_to_megatron(hf, arch_from_hf_config(config))
    assert ("decoder.layers.0.self_attention.linear_qkv.bias" in mg) == (family == "qwen2")
    qk_norm = family in ("qwen3", "qwen3_moe")
    assert ("decoder.layers.0.self_attention.q_layernorm.weight" in mg) == qk_norm
    assert ("output_layer.weight" in mg) == (family in ("llama", "qwen3_moe"))  # untied here


def test_fused_qkv_groups_query_heads_with_their_key_value_head(make_hf_config):
    config, hf = _hf_state(make_hf_config, "llama")
    arch = arch_from_hf_config(config)  # 4 query heads, 2 kv heads, head_dim 16
    d = arch.head_dim
    p = "model.layers.0.self_attn."
    # Label every row with (projection, head) so the layout can be read back.
    hf[p + "q_proj.weight"] = torch.arange(4).repeat_interleave(d)[:, None].float().expand(-1, 64)
    hf[p + "k_proj.weight"] = (
        (10 + torch.arange(2)).repeat_interleave(d)[:, None].float().expand(-1, 64)
    )
    hf[p + "v_proj.weight"] = (
        (20 + torch.arange(2)).repeat_interleave(d)[:, None].float().expand(-1, 64)
    )
    qkv = hf_to_megatron(hf, arch)["decoder.layers.0.self_attention.linear_qkv.weight"]
    heads = qkv[::d, 0].tolist()
    assert heads == [0, 1, 10, 20, 2, 3, 11, 21]


def test_fused_fc1_is_gate_then_up(make_hf_config):
    config, hf = _hf_state(make_hf_config, "qwen3")
    mg = hf_to_megatron(hf, arch_from_hf_config(config))
    fc1 = mg["decoder.layers.1.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:80], hf["model.layers.1.mlp.gate_proj.weight"])
    assert torch.equal(fc1[80:], hf["model.layers.1.mlp.up_proj.weight"])


def test_saved_qwen3_moe_checkpoint_names_each_expert(make_hf_config, tmp_path):
    """The per-expert names the converter reads and writes are the ones save_pretrained writes."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    config, hf = _hf_state(make_hf_config, "qwen3_moe")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(saved) == sorted(hf)
    for name, tensor in hf.items():
        assert torch.equal(saved[name], tensor), name


def test_qwen3_moe_experts_and_router_reach_megatron(make_hf_config):
    config, hf = _hf_state(make_hf_config, "qwen3_moe")
    mg = hf_to_megatron(hf, arch_from_hf_config(config))
    layer, hf_layer = "decoder.layers.1.mlp.", "model.layers.1.mlp."
    assert torch.equal(mg[layer + "router.weight"], hf[hf_layer + "gate.weight"])
    for e in range(4):
        fc1 = mg[f"{layer}experts.local_experts.{e}.linear_fc1.weight"]
        assert fc1.shape == (64, 64)  # [gate; up], 32 rows each
        assert torch.equal(fc1[:32], hf[f"{hf_layer}experts.{e}.gate_proj.weight"])
        assert torch.equal(fc1[32:], hf[f"{hf_layer}experts.{e}.up_proj.weight"])
        fc2 = mg[f"{layer}experts.local_experts.{e}.linear_fc2.weight"]
        assert torch.equal(fc2, hf[f"{hf_layer}experts.{e}.down_proj.weight"])
    assert not any(n.endswith("mlp.linear_fc1.weight") for n in mg)  # no dense MLP
    assert not any(n.endswith("mlp.linear_fc2.weight") for n in mg)


def test_fused_in_memory_experts_convert_like_saved_ones(make_hf_config):
    from transformers import AutoModelForCausalLM

    config, hf = _hf_state(make_hf_config, "qwen3_moe")
    torch.manual_seed(0)
    fused = AutoModelForCausalLM.from_config(config, dtype=torch.float32).state_dict()
    assert fused["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 64, 64)
    assert fused["model.layers.0.mlp.experts.down_proj"].shape == (4, 64, 32)
    arch = arch_from_hf_config(config)
    from_fused, from_saved = hf_to_megatron(fused, arch), hf_to_megatron(hf, arch)
    assert list(from_fused) == list(from_saved)
    for name, tensor in from_saved.items():
        assert torch.equal(from_fused[name], tensor), name


def test_missing_expert_weight_is_named(make_hf_config):
    config, hf = _hf_state(make_hf_config, "qwen3_moe")
    del hf["model.layers.0.mlp.experts.3.up_proj.weight"]
    with pytest.raises(ConversionError, match=r"model\.layers\.0\.mlp\.experts\.3\.up_proj"):
        hf_to_megatron(hf, arch_from_hf_config(config))


def test_expert_parallel_rank_maps_local_experts_to_global_ones():
    name = "decoder.layers.1.mlp.experts.local_experts.{}.linear_fc1.weight"
    # 8 experts over 2 ranks: rank 1's local expert 3 is global expert 7.
    assert expert_to_global(name.format(3), 1, 4) == name.format(7)
    assert expert_to_global(name.format(0), 0, 4) == name.format(0)
    router = "decoder.layers.1.mlp.router.weight"
    assert expert_to_global(router, 1, 4) == router


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"mlp_only_layers": [1]}, r"mlp_only_layers=\[1\]"),
        ({"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
    ],
)
def test_qwen3_moe_with_dense_layers_is_refused(make_hf_config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        arch_from_hf_config(make_hf_config("qwen3_moe", **overrides))


def test_qwen3_moe_routing_fields_are_read(make_hf_config):
    arch = arch_from_hf_config(make_hf_config("qwen3_moe", norm_topk_prob=False))
    assert (arch.num_experts, arch.moe_topk, arch.moe_ffn_hidden_size) == (4, 2, 32)
    assert arch.is_moe and arch.qk_norm and not arch.moe_norm_topk_prob
    assert not arch_from_hf_config(make_hf_config("qwen3")).is_moe


def test_expert_parallel_size_must_divide_experts(make_hf_config):
    arch_from_hf_config(make_hf_config("qwen3_moe")).check_expert_parallel(2)
    with pytest.raises(ConfigError, match=r"--expert-model-parallel-size 3 .* 4 experts"):
        arch_from_hf_config(make_hf_config("qwen3_moe")).check_expert_parallel(3)
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model"):
        arch_from_hf_config(make_hf_config("qwen3")).check_expert_parallel(2)


@pytest.mark.parametrize("family", FAMILIES[:3])  # TP is refused for MoE models
def test_tp2_shard_then_unshard_gives_back_every_weight(make_hf_config, family):
    config, hf = _hf_state(make_hf_config, family)
    full = hf_to_megatron(hf, arch_from_hf_config(config))
    shards = [shard_state_dict(full, 2, r) for r in range(2)]
    merged = unshard_state_dicts(shards)
    assert list(merged) == list(full)
    for name, tensor in full.items():
        assert torch.equal(merged[name], tensor), name


def test_tp2_shards_split_columns_rows_and_vocab(make_hf_config):
    config, hf = _hf_state(make_hf_config, "llama")
    full = hf_to_megatron(hf, arch_from_hf_config(config))
    r1 = shard_state_dict(full, 2, 1)
    layer = "decoder.layers.0."
    # Rank 1 holds the second key/value group whole: query heads 2-3, key 1, value 1.
    assert torch.equal(
        r1[layer + "self_attention.linear_qkv.weight"],
        full[layer + "self_attention.linear_qkv.weight"][64:],
    )
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(r1[layer + "mlp.linear_fc1.weight"], torch.cat([gate[40:], up[40:]]))
    assert torch.equal(
        r1[layer + "self_attention.linear_proj.weight"],
        hf["model.layers.0.self_attn.o_proj.weight"][:, 32:],
    )
    assert torch.equal(
        r1[layer + "mlp.linear_fc2.weight"], hf["model.layers.0.mlp.down_proj.weight"][:, 40:]
    )
    assert torch.equal(r1["embedding.word_embeddings.weight"], hf["model.embed_tokens.weight"][48:])
    assert torch.equal(r1["output_layer.weight"], hf["lm_head.weight"][48:])
    assert torch.equal(r1[layer + "input_layernorm.weight"], full[layer + "input_layernorm.weight"])


def test_shard_refuses_a_size_that_does_not_divide():
    with pytest.raises(ConversionError, match="not divisible by 3"):
        shard("decoder.layers.0.mlp.linear_fc2.weight", torch.zeros(4, 8), 3, 0)


def test_missing_hf_weight_is_named(make_hf_config):
    config, hf = _hf_state(make_hf_config, "qwen2")
    del hf["model.layers.1.self_attn.k_proj.bias"]
    with pytest.raises(ConversionError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias"):
        hf_to_megatron(hf, arch_from_hf_config(config))


def test_unused_hf_weight_is_an_error(make_hf_config):
    config, hf = _hf_state(make_hf_config, "llama")
    hf["model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)
    with pytest.raises(ConversionError, match="does not use"):
        hf_to_megatron(hf, arch_from_hf_config(config))


def test_unknown_megatron_name_is_an_error(make_hf_config):
    arch = arch_from_hf_config(make_hf_config("llama"))
    with pytest.raises(ConversionError, match="not a weight"):
        to_hf("decoder.blocks.0.weight", torch.zeros(1), arch)


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_count_matches_transformers(make_hf_config, family):
    from transformers import AutoModelForCausalLM

    config = make_hf_config(family)
    model = AutoModelForCausalLM.from_config(config)
    assert arch_from_hf_config(config).num_parameters == sum(p.numel() for p in model.parameters())


def test_unsupported_model_type_is_refused():
    from transformers import GPT2Config

    with pytest.raises(ConfigError, match="model_type 'gpt2' is not supported"):
        arch_from_hf_config(GPT2Config())


def test_unsupported_rope_scaling_is_refused(make_hf_config):
    config = make_hf_config(
        "llama", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}
    )
    with pytest.raises(ConfigError, match="rope scaling"):
        arch_from_hf_config(config)


def test_llama3_rope_scaling_is_read(make_hf_config):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    arch = arch_from_hf_config(make_hf_config("llama", rope_parameters=rope))
    assert (arch.rope_theta, arch.rope_scaling_factor) == (500000.0, 8.0)


def test_tensor_parallel_size_must_divide_heads(make_hf_config):
    arch = arch_from_hf_config(make_hf_config("qwen3"))
    arch.check_tensor_parallel(2)
    with pytest.raises(
        ConfigError, match=r"--tensor-model-parallel-size 4 .* key/value heads \(2\)"
    ):
        arch.check_tensor_parallel(4)
