"""Learning-rate schedules and the AdamW parameter groups."""

from __future__ import annotations

import math

import pytest
import torch

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


def test_cpu_parameters_take_fused_adamw_with_the_math_of_the_paper():
    """The CPU trainer's AdamW is torch's fused kernel; three steps of it match AdamW written
    from Loshchilov & Hutter in float64 (decoupled decay, bias-corrected moments)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16))
    cfg = TrainerConfig(hf_checkpoint="x", lr=1e-2, weight_decay=0.1, adam_eps=1e-8)
    optimizer, _ = build_optimizer(model, cfg)
    assert all(g["fused"] for g in optimizer.param_groups)
    start = {n: p.detach().double().clone() for n, p in model.named_parameters()}
    grads = [{n: torch.randn_like(p) for n, p in model.named_parameters()} for _ in range(3)]
    for g in grads:
        for n, p in model.named_parameters():
            p.grad = g[n].clone()
        optimizer.step()
    b1, b2, lr, eps = cfg.adam_beta1, cfg.adam_beta2, cfg.lr, cfg.adam_eps
    for n, p in model.named_parameters():
        decay = cfg.weight_decay if p.ndim >= 2 else 0.0
        w, m, v = start[n], torch.zeros_like(start[n]), torch.zeros_like(start[n])
        for t, g in enumerate(grads, 1):
            gt = g[n].double()
            m, v = b1 * m + (1 - b1) * gt, b2 * v + (1 - b2) * gt * gt
            w = w * (1 - lr * decay) - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
        torch.testing.assert_close(p.detach().double(), w, rtol=1e-6, atol=1e-7, msg=n)
