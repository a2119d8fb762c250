"""The torch trainer on a tiny CPU model: logprobs, packing, accumulation, learning, export."""

from __future__ import annotations

import itertools

import pytest
import torch
from trainer_data import config, make_batch

from vime.training import create_trainer
from vime.training.batch import TrainBatch, TrainSample
from vime.training.packing import plan_micro_batches
from vime.training.torch_backend import TorchTrainer


def reference_logprobs(model, token_ids: list[int]) -> torch.Tensor:
    """log p(x_i | x_<i) of one unpacked sequence, from a plain HF forward."""
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0]
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    return torch.cat([lp.new_zeros(1), lp])


@pytest.mark.parametrize("model", ["tiny_llama", "untied_qwen3"])
def test_packed_logprobs_equal_per_sequence_logprobs(model, request):
    folder = request.getfixturevalue(model)
    batch = make_batch(0)
    budget = 80
    plan = plan_micro_batches([s.num_tokens for s in batch], budget)[0]
    assert any(len(mb.indices) > 1 for mb in plan), "the test must pack sequences together"
    trainer = TorchTrainer(config(folder, max_tokens_per_micro_batch=budget))
    packed = trainer.compute_logprobs(batch)
    assert [len(lp) for lp in packed] == [s.num_tokens for s in batch]
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    for sample, lp in zip(batch, packed, strict=True):
        assert lp.dtype == torch.float32 and lp[0] == 0.0
        ref = reference_logprobs(hf, sample.token_ids).float()
        torch.testing.assert_close(lp, ref, atol=1e-5, rtol=0)


def test_trainer_is_built_by_backend_name(untied_qwen3):
    trainer = create_trainer(config(untied_qwen3))
    assert isinstance(trainer, TorchTrainer) and trainer.weight_version == 0


def test_gradient_accumulation_equals_one_big_batch(untied_qwen3):
    batch = make_batch(1)
    # adam_eps = 1 makes the first update g / (|g| + 1): smooth in the gradient, so equal
    # parameters afterwards mean equal gradients (a tiny eps would amplify rounding noise
    # of near-zero gradients into whole-lr differences).
    common = dict(lr=1.0, adam_eps=1.0, clip_grad=0.0)
    one = TorchTrainer(config(untied_qwen3, max_tokens_per_micro_batch=4096, **common))
    many = TorchTrainer(config(untied_qwen3, max_tokens_per_micro_batch=40, **common))
    m1, m2 = one.train_step(batch), many.train_step(batch)
    assert m1["num_micro_batches"] == 1.0 and m2["num_micro_batches"] >= 3.0
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    assert m2["loss"] == pytest.approx(m1["loss"], abs=1e-6)
    for (name, a), (_, b) in zip(
        one.model.named_parameters(), many.model.named_parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)


def test_policy_loss_falls_and_moves_logprobs_with_the_advantage(untied_qwen3):
    from vime.algorithms.config import LossConfig

    wide_clip = LossConfig(eps_clip=0.5, eps_clip_high=5.0)  # stay inside the trust region
    trainer = TorchTrainer(config(untied_qwen3, lr=5e-4), wide_clip)
    start = trainer.compute_logprobs(make_batch(2))
    batch = make_batch(2, logprobs=start)
    batch.set_logprobs("old_logprobs", start)  # PPO ratios against the starting policy
    losses = [trainer.train_step(batch)["loss"] for _ in range(5)]
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < losses[0] - 0.05
    end = trainer.compute_logprobs(batch)
    for s, a, b in zip(batch, start, end, strict=True):
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        change = float((b - a)[mask].mean())
        assert change * s.advantages[-1] > 0, (s.sample_id, change)
    assert trainer.weight_version == 5


def test_step_metrics_report_loss_norm_lr_and_mismatch(untied_qwen3):
    trainer = TorchTrainer(config(untied_qwen3, lr=2e-3, lr_warmup_iters=2))
    logprobs = trainer.compute_logprobs(make_batch(3))
    metrics = trainer.train_step(make_batch(3, logprobs=logprobs))
    assert metrics["lr"] == pytest.approx(1e-3)  # first of two warmup steps
    assert metrics["num_loss_tokens"] == make_batch(3).num_loss_tokens
    # Rollout logprobs are this very policy's: no mismatch, ratio 1, nothing clipped.
    assert metrics["mismatch/abs_diff_max"] < 1e-5
    assert metrics["policy/ratio_mean"] == pytest.approx(1.0)
    assert metrics["policy/clipfrac_high"] == 0.0
    assert 0.0 < metrics["policy/entropy"] <= torch.log(torch.tensor(384.0)).item()
    assert metrics["grad_norm"] > 0 and metrics["tokens_per_s"] > 0


def test_mixed_presence_of_old_logprobs_is_an_error(untied_qwen3):
    trainer = TorchTrainer(config(untied_qwen3, max_tokens_per_micro_batch=4096))
    batch = make_batch(4, num_samples=2)
    batch[0].old_logprobs = list(batch[0].rollout_logprobs)
    with pytest.raises(ValueError, match="some samples have old_logprobs and some do not"):
        trainer.train_step(batch)


def test_batch_without_loss_tokens_is_refused(untied_qwen3):
    trainer = TorchTrainer(config(untied_qwen3))
    empty = TrainBatch([TrainSample([1, 2], [0, 0], [0.0, 0.0], [0.0, 0.0])])
    with pytest.raises(ValueError, match="none of the 1 samples has a token with loss_mask 1"):
        trainer.train_step(empty)


def test_bf16_compute_stays_close_to_fp32(untied_qwen3):
    batch = make_batch(5, num_samples=2)
    fp32 = TorchTrainer(config(untied_qwen3)).compute_logprobs(batch)
    bf16 = TorchTrainer(config(untied_qwen3, dtype="bfloat16")).compute_logprobs(batch)
    for a, b in zip(fp32, bf16, strict=True):
        assert b.dtype == torch.float32
        assert 0 < float((a - b).abs().max()) < 0.5


def test_export_names_and_tensors_equal_the_hf_checkpoint(tiny_llama, untied_qwen3):
    from safetensors.torch import load_file

    for folder in (tiny_llama, untied_qwen3):
        hf = load_file(folder / "model.safetensors")
        trainer = TorchTrainer(config(folder))
        buckets = list(trainer.export_weights(bucket_bytes=200_000))
        exported = [item for bucket in buckets for item in bucket]
        assert sorted(name for name, _ in exported) == sorted(hf)
        for name, tensor in exported:
            torch.testing.assert_close(tensor, hf[name], atol=0, rtol=0, msg=name)
        for bucket in buckets:  # a bucket exceeds the budget only to hold one big tensor
            size = sum(t.numel() * t.element_size() for _, t in bucket)
            assert size <= 200_000 or len(bucket) == 1
    assert "lm_head.weight" in hf and len(buckets) > 1


def test_export_rejects_a_non_positive_bucket(untied_qwen3):
    with pytest.raises(ValueError, match="bucket_bytes must be > 0, got 0"):
        next(TorchTrainer(config(untied_qwen3)).export_weights(bucket_bytes=0))


@pytest.mark.parametrize("shard_bytes", [1 << 30, 300_000])
def test_save_hf_writes_a_loadable_folder_of_the_trained_weights(tiny_llama, tmp_path, shard_bytes):
    import json

    from transformers import AutoModelForCausalLM

    trainer = TorchTrainer(config(tiny_llama))
    batch = make_batch(6, num_samples=2)
    trainer.train_step(batch)
    out = trainer.save_hf(tmp_path / "hf", max_shard_bytes=shard_bytes)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    if shard_bytes > 1 << 20:
        assert "model.safetensors" in names
    else:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    expected = trainer.compute_logprobs(batch)
    for sample, lp in zip(batch, expected, strict=True):
        ref = reference_logprobs(reloaded, sample.token_ids)
        torch.testing.assert_close(ref, lp, atol=1e-5, rtol=0)


def test_entropy_bonus_and_kl_term_use_the_packed_per_token_values(untied_qwen3):
    from vime.algorithms.config import LossConfig

    batch = make_batch(7, num_samples=3)
    plain = TorchTrainer(config(untied_qwen3, max_tokens_per_micro_batch=4096))
    expected = plain.train_step(batch)
    loss = LossConfig(entropy_coef=0.01, kl_loss_coef=0.1)
    trainer = TorchTrainer(config(untied_qwen3, max_tokens_per_micro_batch=48), loss)
    batch.set_logprobs("ref_logprobs", trainer.compute_logprobs(batch))
    metrics = trainer.train_step(batch)
    # Entropy with gradient (entropy_coef > 0) equals the metric-only computation.
    assert metrics["policy/entropy"] == pytest.approx(expected["policy/entropy"], rel=1e-5)
    assert metrics["policy/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # reference == policy
    assert metrics["loss"] == pytest.approx(
        expected["loss"] - 0.01 * expected["policy/entropy"], abs=1e-5
    )


def test_step_logprobs_are_the_trained_samples_under_the_weights_before_the_step(untied_qwen3):
    trainer = TorchTrainer(config(untied_qwen3, lr=1e-2, max_tokens_per_micro_batch=40))
    assert trainer.step_logprobs() == []
    batch = make_batch(4)
    before = trainer.compute_logprobs(batch)
    trainer.train_step(batch)
    kept = trainer.step_logprobs()
    assert [len(lp) for lp in kept] == [s.num_tokens for s in batch]
    for s, a, b in zip(batch, before, kept, strict=True):
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        torch.testing.assert_close(b[mask], a[mask], atol=1e-5, rtol=0)
        assert (b[~mask] == 0).all()  # the step scores loss-mask tokens only
    after = trainer.compute_logprobs(batch)
    assert float((after[0] - kept[0]).abs().max()) > 1e-3  # the step moved the policy


@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_scoring_only_loss_rows_changes_no_step_result(untied_qwen3, monkeypatch, entropy_coef):
    # The step sends only loss-mask rows through the output layer; the same step with every
    # row scored must give the same loss, metrics, updated weights and kept logprobs.
    import vime.training.packing as packing

    def batch() -> TrainBatch:
        b = make_batch(8)
        for s in b:  # a tool-output hole in each response, as in a multi-turn episode
            hole = len(s.loss_mask) - 3
            s.loss_mask[hole] = 0
            s.advantages[hole] = s.rollout_logprobs[hole] = 0.0
        return b

    def step() -> tuple[dict, dict, list]:
        from vime.algorithms.config import LossConfig

        loss = LossConfig(entropy_coef=entropy_coef)
        trainer = TorchTrainer(config(untied_qwen3, lr=1e-3), loss)
        metrics = trainer.train_step(batch())
        weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        return metrics, weights, trainer.step_logprobs()

    fast = step()
    original = packing.pack_inputs
    monkeypatch.setattr(
        packing, "pack_inputs", lambda s, mb, loss_rows_only=False, **kw: original(s, mb, **kw)
    )
    full = step()
    for key in ("loss", "grad_norm", "policy/entropy", "mismatch/abs_diff_mean"):
        assert fast[0][key] == pytest.approx(full[0][key], rel=1e-5, abs=1e-7), key
    for name, w in full[1].items():
        # Adam divides by the gradient's scale: rounding-level gradient differences move an
        # element by a small fraction of one lr-sized (1e-3) step.
        torch.testing.assert_close(fast[1][name], w, rtol=0, atol=1e-5)
    for s, a, b in zip(batch(), fast[2], full[2], strict=True):
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        torch.testing.assert_close(a[mask], b[mask], rtol=0, atol=1e-6)
        assert (a[~mask] == 0).all()  # unscored rows are 0.0, as the dumps record them


def _file_mappings(path) -> list[tuple[int, int]]:
    """This process's address ranges mapped from ``path`` (Linux /proc/self/maps)."""
    target = str(path.resolve())
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == target:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((lo, hi))
    return ranges


def test_cpu_weights_live_in_the_trainers_memory_not_the_checkpoint_file(tiny_llama):
    """from_pretrained maps an fp32 checkpoint's weights from its file; writing them there
    would copy each page on its first write (the first optimizer step). The CPU trainer's
    parameters are its own memory, and the file's mapping is released."""
    from transformers import AutoModelForCausalLM

    weights = tiny_llama / "model.safetensors"

    def in_file(t: torch.Tensor) -> bool:
        return any(lo <= t.data_ptr() < hi for lo, hi in _file_mappings(weights))

    # The case this guards: plain from_pretrained keeps weights in the file's mapping.
    mapped = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    assert any(in_file(p) for p in mapped.parameters())
    del mapped
    trainer = TorchTrainer(config(tiny_llama))
    params = list(trainer.model.parameters())
    assert params and not any(in_file(p) for p in params)
    # Tied input and output embeddings stay one tensor.
    model = trainer.model
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
