"""Deterministic batches and model folders for trainer tests (importable by spawned workers)."""

from __future__ import annotations

import random
from pathlib import Path

from vime.training.base import TrainerConfig
from vime.training.batch import TrainBatch, TrainSample


def build_untied_qwen3(out: Path, vocab_size: int = 384) -> Path:
    """Write a random 2-layer Qwen3 with an untied lm_head into ``out``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
    )
    Qwen3ForCausalLM(config).save_pretrained(out)
    return out


def make_batch(
    seed: int,
    num_samples: int = 6,
    vocab_size: int = 384,
    min_len: int = 6,
    max_len: int = 40,
    logprobs: list | None = None,
) -> TrainBatch:
    """Random prompt + completion samples; advantages +1/-1 alternating per sample.

    ``logprobs`` (per-sample tensors, e.g. from ``compute_logprobs``) fill the rollout
    logprobs on the completion; without them a fixed pseudo-logprob is used.
    """
    rng = random.Random(seed)
    samples = []
    for i in range(num_samples):
        n = rng.randint(min_len, max_len)
        prompt = rng.randint(1, n - 1)
        mask = [0] * prompt + [1] * (n - prompt)
        if logprobs is None:
            rollout = [-1.5 * m for m in mask]
        else:
            rollout = [float(lp) * m for lp, m in zip(logprobs[i].tolist(), mask, strict=True)]
        adv = 1.0 if i % 2 == 0 else -1.0
        samples.append(
            TrainSample(
                token_ids=[rng.randrange(vocab_size) for _ in range(n)],
                loss_mask=mask,
                advantages=[adv * m for m in mask],
                rollout_logprobs=rollout,
                sample_id=f"s{i}",
            )
        )
    return TrainBatch(samples)


def sample(prompt: list[int], response: list[int], adv: float = 1.0) -> TrainSample:
    mask = [0] * len(prompt) + [1] * len(response)
    return TrainSample(
        prompt + response, mask, [adv * m for m in mask], [-1.5 * m for m in mask], sample_id=""
    )


def grouped_batch(seed: int, groups: int = 3, n: int = 4, vocab: int = 384) -> TrainBatch:
    """``groups`` prompts with ``n`` samples each (GRPO-shaped), advantages of both signs."""
    rng = random.Random(seed)
    samples = []
    for _ in range(groups):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(3, 12))]
        for k in range(n):
            response = [rng.randrange(vocab) for _ in range(rng.randint(1, 15))]
            samples.append(sample(prompt, response, 1.0 if k % 2 else -1.0))
    return TrainBatch(samples)


def config(model: Path, **overrides) -> TrainerConfig:
    """A trainer config for tests: fp32, a small token budget, a visible learning rate."""
    values = dict(hf_checkpoint=str(model), lr=1e-3, max_tokens_per_micro_batch=64, seed=7)
    values.update(overrides)
    return TrainerConfig(**values)


def train_and_report(model: Path, steps: int, save_dir: Path | None = None) -> dict:
    """Train ``steps`` steps on fixed batches and return what a comparison needs.

    Runs the same in one process or on every rank of a process group (SPMD).
    """
    from vime.training.torch_backend import TorchTrainer

    trainer = TorchTrainer(config(model, max_tokens_per_micro_batch=48))
    logprobs = trainer.compute_logprobs(make_batch(20, num_samples=5))
    # Odd steps train GRPO-shaped groups, whose prompts the micro-batches hold once.
    metrics = [
        trainer.train_step(grouped_batch(21 + i) if i % 2 else make_batch(21 + i, num_samples=5))
        for i in range(steps)
    ]
    weights = {n: t.clone() for b in trainer.export_weights(bucket_bytes=1 << 16) for n, t in b}
    if save_dir is not None:
        trainer.save(save_dir)
    return {"logprobs": logprobs, "metrics": metrics, "weights": weights}


def fail_on_rank_one() -> int:
    """Raise on rank 1 of the process group; return the rank elsewhere."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("boom on purpose")
    return dist.get_rank()
