"""MegatronTrainer on CPU (megatron-core through the test-only shim): logits match transformers,
training, gradient accumulation, checkpoints, roles and weight export."""

from __future__ import annotations

import pytest
import torch

from vime.errors import ConfigError
from vime.training.base import TrainerConfig
from vime.training.batch import TrainBatch, TrainSample

# Every test runs megatron-core through the CPU shim; transformers references are computed
# outside it (in session fixtures, set up first), since the shim is for Megatron alone.
pytestmark = pytest.mark.usefixtures("megatron_cpu")


def _sample(ids: list[int], adv: float, sample_id: str) -> TrainSample:
    mask = [0, 0] + [1] * (len(ids) - 2)
    return TrainSample(
        token_ids=ids,
        loss_mask=mask,
        advantages=[adv * m for m in mask],
        rollout_logprobs=[-2.0 * m for m in mask],
        sample_id=sample_id,
    )


def _batch() -> TrainBatch:
    g = torch.Generator().manual_seed(3)
    lengths = [17, 9, 12, 6]
    return TrainBatch(
        [
            _sample(torch.randint(0, 96, (n,), generator=g).tolist(), (-1.0) ** i, str(i))
            for i, n in enumerate(lengths)
        ]
    )


def _trainer(folder, role="actor", args=(), **config):
    from vime.training.megatron.trainer import MegatronTrainer

    cfg = TrainerConfig(hf_checkpoint=str(folder), backend="megatron", seed=7, **config)
    return MegatronTrainer(cfg, megatron_args=list(args), role=role)


@pytest.fixture(scope="session")
def hf_logprobs(tiny_models) -> dict[str, list[torch.Tensor]]:
    """transformers' logprobs of :func:`_batch`, each sequence alone, per family."""
    from transformers import AutoModelForCausalLM

    out: dict[str, list[torch.Tensor]] = {}
    for family, folder in tiny_models.items():
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        out[family] = []
        with torch.no_grad():
            for s in _batch():
                ids = torch.tensor([s.token_ids])
                logits = model(ids).logits[0, :-1]
                lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])
                out[family].append(torch.cat([torch.zeros(1), lp[:, 0]]))
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "qwen3_moe"])
def test_packed_logprobs_match_transformers(tiny_models, hf_logprobs, family):
    batch = _batch()
    # All four sequences share one packed micro-batch (Megatron's thd path).
    trainer = _trainer(tiny_models[family], role="reference")
    mine = trainer.compute_logprobs(batch)
    ref = hf_logprobs[family]
    for got, want, s in zip(mine, ref, batch, strict=True):
        assert got.shape == (s.num_tokens,)
        assert got[0] == 0.0
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    assert min(float(t[1:].min()) for t in mine) < -3.0  # real logprobs, not zeros


def test_reference_role_holds_no_optimizer(tiny_models):
    trainer = _trainer(tiny_models["qwen3"], role="reference")
    assert trainer.optimizer is None
    with pytest.raises(RuntimeError, match="role 'reference' and holds no optimizer"):
        trainer.train_step(_batch())


def test_unknown_role_is_refused(tiny_models):
    with pytest.raises(ConfigError, match="role 'critic' is unknown"):
        _trainer(tiny_models["qwen3"], role="critic")


def test_entropy_bonus_with_tensor_parallelism_is_refused(tiny_models):
    from vime.algorithms.config import LossConfig
    from vime.training.megatron.trainer import MegatronTrainer

    cfg = TrainerConfig(hf_checkpoint=str(tiny_models["qwen3"]), backend="megatron")
    with pytest.raises(ConfigError, match="--entropy-coef"):
        MegatronTrainer(
            cfg, LossConfig(entropy_coef=0.01), megatron_args=["--tensor-model-parallel-size", "2"]
        )


def test_export_gives_the_loaded_hf_weights_in_buckets(tiny_models):
    from safetensors.torch import load_file

    hf = load_file(str(tiny_models["llama"] / "model.safetensors"))
    trainer = _trainer(tiny_models["llama"], role="reference")
    buckets = list(trainer.export_weights(bucket_bytes=20_000))
    assert len(buckets) > 3
    names = [n for b in buckets for n, _ in b]
    assert sorted(names) == sorted(hf)
    for bucket in buckets:
        for name, tensor in bucket:
            assert torch.equal(tensor, hf[name]), name
    with pytest.raises(ValueError, match="bucket_bytes must be > 0"):
        next(trainer.export_weights(bucket_bytes=0))


@pytest.mark.slow
def test_training_moves_logprobs_along_the_advantages(tiny_models):
    trainer = _trainer(tiny_models["qwen2"], lr=1e-2)
    batch = _batch()
    before = trainer.compute_logprobs(batch)
    exported = {n: t.clone() for b in trainer.export_weights() for n, t in b}
    for _ in range(3):
        trainer.train_step(batch)
    assert trainer.weight_version == 3
    after = trainer.compute_logprobs(batch)
    # Samples 0 and 2 have advantage +1, samples 1 and 3 have -1.
    for i, s in enumerate(batch):
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        change = float((after[i] - before[i])[mask].mean())
        assert change > 0 if i % 2 == 0 else change < 0, (i, change)
    bias = "model.layers.0.self_attn.q_proj.bias"
    new = {n: t for b in trainer.export_weights() for n, t in b}
    assert not torch.equal(new[bias], exported[bias])


@pytest.mark.slow
def test_micro_batching_gives_the_gradient_of_one_big_batch(tiny_models):
    batch = _batch()
    packed = _trainer(tiny_models["qwen3"]).train_step(batch)
    split = _trainer(tiny_models["qwen3"], max_tokens_per_micro_batch=17).train_step(batch)
    # 17 | 12 | 9 + 6: three micro-batches against one.
    assert (split["num_micro_batches"], packed["num_micro_batches"]) == (3, 1)
    assert split["grad_norm"] == pytest.approx(packed["grad_norm"], rel=1e-5)
    assert split["loss"] == pytest.approx(packed["loss"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("args", [[], ["--bf16", "--use-distributed-optimizer"]])
def test_save_load_resumes_exactly(tiny_models, tmp_path, args):
    batch = _batch()
    trainer = _trainer(tiny_models["llama"], args=args, lr=1e-3)
    trainer.train_step(batch)
    trainer.save(tmp_path / "ckpt")
    continued = [trainer.train_step(batch) for _ in range(2)]
    trainer.load(tmp_path / "ckpt")
    assert trainer.weight_version == 1
    # Two steps: the second shows whether Adam's step counts came back right.
    resumed = [trainer.train_step(batch) for _ in range(2)]
    for a, b in zip(continued, resumed, strict=True):
        assert (a["loss"], a["grad_norm"], a["lr"]) == (b["loss"], b["grad_norm"], b["lr"])


def test_load_refuses_a_torch_backend_checkpoint(tiny_models, tmp_path):
    from vime.training import checkpoint as ckpt

    with ckpt.atomic_checkpoint(tmp_path / "torch_ckpt", {"backend": "torch"}) as tmp:
        (tmp / "model.pt").write_bytes(b"x")
    trainer = _trainer(tiny_models["qwen3"], role="reference")
    with pytest.raises(ckpt.CheckpointError, match="written by the 'torch' backend"):
        trainer.load(tmp_path / "torch_ckpt")
