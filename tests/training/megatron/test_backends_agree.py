"""The torch and Megatron backends run one training-step algorithm: on the same model and batch
they give the same loss, normalisers, metrics and step logprobs, and the same errors."""

from __future__ import annotations

import pytest
import torch
from megatron_cpu import signed_batch

from vime.errors import ConfigError
from vime.training.base import TrainerConfig
from vime.training.batch import TrainBatch, TrainSample

TOKENS = [[5, 9, 14, 3, 77, 41, 8, 60, 2, 19, 33], [4, 81, 23, 7, 7, 56, 90], [12, 6, 48, 30, 71]]
BACKENDS = ("torch", "megatron")


def _config(folder, backend: str, **overrides) -> TrainerConfig:
    values = dict(hf_checkpoint=str(folder), backend=backend, seed=7, lr=1e-3)
    values.update(overrides)
    return TrainerConfig(**values)


def _trainer(folder, backend: str, **overrides):
    from vime.training import create_trainer

    return create_trainer(_config(folder, backend, **overrides))


def _step(trainer) -> dict:
    batch = signed_batch(TOKENS)
    before = trainer.compute_logprobs(batch)
    metrics = trainer.train_step(batch)
    return {"before": before, "metrics": metrics, "kept": trainer.step_logprobs()}


@pytest.fixture(scope="module")
def torch_step(tiny_models) -> dict:
    """One torch-backend step (outside the CPU shim, which is for Megatron alone)."""
    return _step(_trainer(tiny_models["qwen2"], "torch", max_tokens_per_micro_batch=12))


def test_both_backends_step_alike_on_the_same_batch(tiny_models, torch_step, megatron_cpu):
    mine = _step(_trainer(tiny_models["qwen2"], "megatron", max_tokens_per_micro_batch=12))
    got, want = mine["metrics"], torch_step["metrics"]
    # Same micro-batches, normalisers and metric names: one step algorithm.
    assert sorted(got) == sorted(want)
    for key in ("num_micro_batches", "num_loss_tokens", "num_tokens", "policy/num_tokens"):
        assert got[key] == want[key], key
    assert got["num_loss_tokens"] == 17 and got["num_micro_batches"] == 2  # [11], [7 + 5]
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    for key in want:
        if key.startswith(("policy/", "mismatch/")):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    # Both keep the step's own logprobs, equal to compute_logprobs before the step on the
    # loss-mask tokens (the only ones the step scores) and 0.0 elsewhere.
    masks = [torch.tensor(s.loss_mask, dtype=torch.bool) for s in signed_batch(TOKENS)]
    for side in (mine, torch_step):
        assert len(side["kept"]) == len(TOKENS)
        for a, b, mask in zip(side["kept"], side["before"], masks, strict=True):
            torch.testing.assert_close(a[mask], b[mask], atol=1e-6, rtol=0)
            assert (a[~mask] == 0).all()
    for a, b in zip(mine["kept"], torch_step["kept"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_hf_checkpoint_is_the_same_config_error(backend, megatron_cpu):
    with pytest.raises(ConfigError, match="--hf-checkpoint is not set"):
        _trainer("", backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_batches_raise_the_same_errors(tiny_models, backend, megatron_cpu):
    trainer = _trainer(tiny_models["qwen2"], backend)
    mixed = signed_batch(TOKENS[:2])
    mixed[0].old_logprobs = list(mixed[0].rollout_logprobs)
    with pytest.raises(ValueError, match="some samples have old_logprobs and some do not"):
        trainer.train_step(mixed)
    empty = TrainBatch([TrainSample([1, 2], [0, 0], [0.0, 0.0], [0.0, 0.0])])
    with pytest.raises(ValueError, match="none of the 1 samples has a token with loss_mask 1"):
        trainer.train_step(empty)
    assert trainer.weight_version == 0
