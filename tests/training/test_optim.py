"""Learning-rate schedules and the AdamW parameter groups."""

from __future__ import annotations

import math

import pytest

from vime.training.base import TrainerConfig
from vime.training.optim import LRSchedule, build_optimizer, lr_at


def test_warmup_is_linear_then_constant():
    cfg = TrainerConfig(lr=1.0, lr_warmup_iters=4)
    assert [lr_at(s, cfg) for s in (1, 2, 4, 5, 100)] == [0.25, 0.5, 1.0, 1.0, 1.0]


def test_cosine_decays_from_lr_to_min_lr():
    cfg = TrainerConfig(
        lr=1.0, min_lr=0.1, lr_warmup_iters=2, lr_decay_style="cosine", train_iters=12
    )
    assert lr_at(2, cfg) == 1.0
    assert lr_at(7, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(12, cfg) == pytest.approx(0.1)
    assert lr_at(50, cfg) == pytest.approx(0.1)


def test_linear_decay_midpoint():
    cfg = TrainerConfig(lr=2.0, lr_decay_style="linear", train_iters=10)
    assert lr_at(5, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == 0.0


def test_step_zero_is_an_error():
    with pytest.raises(ValueError, match="count from 1"):
        lr_at(0, TrainerConfig())


def test_schedule_sets_group_lr_and_restores_its_state():
    import torch

    cfg = TrainerConfig(lr=1.0, lr_warmup_iters=10, weight_decay=0.1)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    optimizer, schedule = build_optimizer(model, cfg)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert [len(g["params"]) for g in optimizer.param_groups] == [1, 3]  # matrix | biases+norm
    for _ in range(3):
        schedule.apply_next()
        schedule.step()
    again = LRSchedule(optimizer, cfg)
    again.load_state_dict(schedule.state_dict())
    assert again.apply_next() == pytest.approx(0.4)
    assert optimizer.param_groups[1]["lr"] == pytest.approx(0.4)
