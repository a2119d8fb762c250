"""The RL loop keeps the trainer's per-token logprobs of each trained episode in the step's
dump (from the loss's own forward, before the update), where ``vime view`` shows them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from stub_engine import StubServer

from vime.cli.main import parse_args
from vime.cli.train_cmd import build_setup
from vime.orchestration.loop import RLLoop
from vime.training.batch import TrainBatch, TrainSample
from vime.training.torch_backend import TorchTrainer
from vime.view import build

TASKS = [{"id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]


async def test_a_step_dump_carries_the_trainer_logprobs_of_its_episodes(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    argv = ["train", "--model", str(tiny_model), "--env", "vime/Math-v0", "--num-steps", "3"]
    argv += ["--output-dir", str(tmp_path), "--rollout-batch-size", "2", "--n", "2"]
    setup = build_setup(parse_args(argv))
    trainer = TorchTrainer(setup.trainer, setup.loss)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    async with StubServer(tokenizer, lambda prompt: "\\boxed{2} and more words") as server:
        cluster = SimpleNamespace(
            base_url=server.url,
            model_name="stub",
            trainer_call=lambda method, *args: getattr(trainer, method)(*args),
            sync_weights=lambda version: {},
            pause_engines=lambda: None,
        )
        logger = SimpleNamespace(log=lambda step, metrics: None)
        loop = RLLoop(setup, cluster, logger=logger, tasks=TASKS, eval_tasks=[])
        groups, _, position = await loop.rollout()
    episodes = [t for g in groups for t in g]
    # What the policy gave each episode's tokens before the step.
    before = trainer.compute_logprobs(
        TrainBatch([TrainSample.from_trajectory(t, 0.0) for t in episodes])
    )
    metrics = loop.train(groups, None)
    loop.after_step(metrics, groups, position)

    lines = (tmp_path / "trajectories" / "step_000001.jsonl").read_text().splitlines()
    dumped = [json.loads(line) for line in lines]
    assert len(dumped) == len(episodes) == 4
    for record, lp in zip(dumped, before, strict=True):
        mask = torch.tensor(record["loss_mask"], dtype=torch.bool)
        kept = torch.tensor(record["metadata"]["trainer_logprobs"])
        assert mask.any() and kept.shape == lp.shape
        torch.testing.assert_close(kept[mask], lp[mask], atol=2e-5, rtol=0)
        assert not kept[~mask].any()
    # The viewer reads them: every episode gets its largest trainer - rollout gap.
    _, packed, _ = build(tmp_path)
    assert all(gap is not None for gap in packed.index["mismatch"])
