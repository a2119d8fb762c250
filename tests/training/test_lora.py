"""LoRA in the torch backend: exact at init, adapters are the only trainable state."""

from __future__ import annotations

import torch
from trainer_data import config, make_batch

from vime.training.lora import LoRALinear, lora_modules
from vime.training.torch_backend import TorchTrainer


def test_lora_logprobs_equal_base_at_init_and_only_adapters_train(untied_qwen3):
    base = TorchTrainer(config(untied_qwen3))
    lora = TorchTrainer(config(untied_qwen3, lora_rank=4, lora_alpha=8.0, lr=1e-2))
    batch = make_batch(2)
    for a, b in zip(base.compute_logprobs(batch), lora.compute_logprobs(batch), strict=True):
        assert torch.equal(a, b)

    adapters = lora_modules(lora.model)
    n_layers = lora.model.config.num_hidden_layers
    assert len(adapters) == 4 * n_layers  # q, k, v, o per layer
    assert all(m.scale == 2.0 for m in adapters.values())
    trainable = [n for n, p in lora.model.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    optimized = [p for g in lora.optimizer.param_groups for p in g["params"]]
    assert len(optimized) == 2 * len(adapters)
    assert sum(p.numel() for p in optimized) == sum(
        m.lora_A.numel() + m.lora_B.numel() for m in adapters.values()
    )

    frozen = {
        n: p.detach().clone() for n, p in lora.model.named_parameters() if not p.requires_grad
    }
    logprobs = lora.compute_logprobs(batch)
    lora.train_step(make_batch(2, logprobs=logprobs))
    for n, p in lora.model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen[n]), n
    assert any(m.lora_B.abs().sum() > 0 for m in adapters.values())


def test_lora_linear_merged_weight_matches_forward():
    torch.manual_seed(0)
    layer = LoRALinear(torch.nn.Linear(8, 6), rank=2, alpha=4.0)
    torch.nn.init.normal_(layer.lora_B)
    x = torch.randn(3, 8)
    merged = torch.nn.functional.linear(x, layer.merged_weight(), layer.base.bias)
    torch.testing.assert_close(layer(x), merged)


def _trained_lora(model):
    trainer = TorchTrainer(config(model, lora_rank=4, lora_alpha=8.0, lr=1e-2))
    batch = make_batch(2)
    trainer.train_step(make_batch(2, logprobs=trainer.compute_logprobs(batch)))
    return trainer


def test_merged_hf_export_equals_the_adapter_model(untied_qwen3, tmp_path):
    from vime.training.hf_export import save_hf_checkpoint

    trainer = _trained_lora(untied_qwen3)
    save_hf_checkpoint(trainer, tmp_path / "merged")
    out = trainer.save_hf(tmp_path / "with_adapter")
    assert (out / "lora_adapter" / "adapter_model.safetensors").is_file()
    merged = TorchTrainer(config(tmp_path / "merged"))
    batch = make_batch(2)
    for a, b in zip(trainer.compute_logprobs(batch), merged.compute_logprobs(batch), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_sync_pushes_only_the_targeted_layers_merged(untied_qwen3):
    trainer = _trained_lora(untied_qwen3)
    full = dict(t for bucket in trainer.export_weights() for t in bucket)
    synced = dict(t for bucket in trainer.export_synced_weights() for t in bucket)
    n_layers = trainer.model.config.num_hidden_layers
    assert len(synced) == 4 * n_layers
    assert all(
        n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"))
        for n in synced
    )
    assert not any("lora" in n or ".base." in n for n in full)
    for name, tensor in synced.items():
        assert torch.equal(tensor, full[name])
    assert sum(t.numel() for t in synced.values()) < sum(t.numel() for t in full.values()) / 2


def test_peft_adapter_folder_has_peft_keys_and_rebuilds_the_merged_weights(untied_qwen3, tmp_path):
    import json

    from safetensors.torch import load_file

    from vime.training.lora import save_peft_adapter

    trainer = _trained_lora(untied_qwen3)
    out = save_peft_adapter(trainer.model, tmp_path / "adapter", base_model=str(untied_qwen3))
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8.0
    assert cfg["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    tensors = load_file(out / "adapter_model.safetensors")
    merged = dict(t for bucket in trainer.export_weights() for t in bucket)
    base = load_file(untied_qwen3 / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj"
    a = tensors[f"base_model.model.{name}.lora_A.weight"]
    b = tensors[f"base_model.model.{name}.lora_B.weight"]
    assert a.shape[0] == 4 and b.shape[1] == 4
    assert len(tensors) == 2 * len(lora_modules(trainer.model))
    torch.testing.assert_close(base[f"{name}.weight"] + 2.0 * b @ a, merged[f"{name}.weight"])


def test_checkpoint_round_trip_covers_the_adapters(untied_qwen3, tmp_path):
    cfg = config(untied_qwen3, lora_rank=4, lora_alpha=8.0, lr=1e-2)
    a = _trained_lora(untied_qwen3)
    a.save(tmp_path / "ckpt")
    b = TorchTrainer(cfg)
    b.load(tmp_path / "ckpt")
    for (name, m), other in zip(
        lora_modules(a.model).items(), lora_modules(b.model).values(), strict=True
    ):
        assert torch.equal(m.lora_A, other.lora_A) and torch.equal(m.lora_B, other.lora_B), name
    batch = make_batch(3)
    batch = make_batch(3, logprobs=a.compute_logprobs(batch))
    assert a.train_step(batch)["loss"] == b.train_step(batch)["loss"]
    for m, other in zip(
        lora_modules(a.model).values(), lora_modules(b.model).values(), strict=True
    ):
        assert torch.equal(m.lora_B, other.lora_B)


def test_lora_on_megatron_is_refused():
    import pytest

    from vime.errors import ConfigError
    from vime.training.base import TrainerConfig

    with pytest.raises(ConfigError, match="--lora-rank needs --backend torch"):
        TrainerConfig(backend="megatron", lora_rank=8)
