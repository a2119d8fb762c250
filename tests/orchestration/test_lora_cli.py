"""LoRA through the path users run: ``vime train`` flags -> the run's configs -> the trainer,
which then trains the adapters and nothing else."""

from __future__ import annotations

import torch

from vime.cli.main import parse_args
from vime.cli.train_cmd import build_setup
from vime.training.batch import TrainBatch, TrainSample
from vime.training.torch_backend import TorchTrainer


def test_lora_flags_reach_the_trainer_and_only_adapters_train(tiny_model, tmp_path):
    argv = ["train", "--model", str(tiny_model), "--env", "vime/Math-v0"]
    argv += ["--output-dir", str(tmp_path), "--lr", "1e-2"]
    argv += ["--lora-rank", "4", "--lora-alpha", "8", "--lora-target-modules", "q_proj,v_proj"]
    setup = build_setup(parse_args(argv))
    assert (setup.trainer.lora_rank, setup.trainer.lora_alpha) == (4, 8)
    assert setup.trainer.lora_target_modules == "q_proj,v_proj"
    trainer = TorchTrainer(setup.trainer, setup.loss)
    named = dict(trainer.model.named_parameters())
    adapters = {n for n in named if "lora_" in n}
    assert adapters and all(("q_proj" in n or "v_proj" in n) for n in adapters)
    trained = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert trained == {id(named[n]) for n in adapters}
    before = {n: p.detach().clone() for n, p in named.items()}
    ids = [3, 17, 22, 9, 41, 5, 8, 30]
    mask = [0, 0] + [1] * 6
    sample = TrainSample(
        token_ids=ids,
        loss_mask=mask,
        advantages=[float(m) for m in mask],
        rollout_logprobs=[-2.0 * m for m in mask],
    )
    trainer.train_step(TrainBatch([sample]))
    changed = {n for n, p in named.items() if not torch.equal(p.detach(), before[n])}
    # lora_B starts at zero, so after one step at least the B matrices moved.
    assert changed and changed <= adapters
    assert any("lora_B" in n for n in changed)


ALL_LINEAR = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def test_quickstart_takes_the_lora_flags_with_the_lora_lr_and_targets():
    setup = build_setup(
        parse_args(["train", "--quickstart", "--lora-rank", "8", "--lora-alpha", "16"])
    )
    assert (setup.trainer.lora_rank, setup.trainer.lora_alpha) == (8, 16)
    assert setup.trainer.backend == "torch"
    assert (setup.trainer.lr, setup.trainer.lora_target_modules) == (1e-3, ALL_LINEAR)
    # Without LoRA (or with rank 0) the preset trains the full model at its own lr.
    for extra in ([], ["--lora-rank=0"]):
        full = build_setup(parse_args(["train", "--quickstart", *extra])).trainer
        assert (full.lora_rank, full.lr) == (0, 2e-5)


def test_flags_win_over_the_quickstart_lora_overlay():
    argv = ["train", "--quickstart", "--lora-rank=4", "--lr", "3e-4"]
    argv += ["--lora-target-modules", "q_proj,v_proj"]
    trainer = build_setup(parse_args(argv)).trainer
    assert (trainer.lora_rank, trainer.lr, trainer.lora_target_modules) == (
        4,
        3e-4,
        "q_proj,v_proj",
    )
