"""Loss flags through the path `vime train` runs: flags -> LossConfig -> `policy_loss`, the
function both trainer backends call, against the papers' objectives computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from vime.algorithms.config import POLICY_LOSSES
from vime.algorithms.losses import gspo_loss, ppo_clip_loss
from vime.algorithms.policy import policy_loss
from vime.cli.main import build_parser, parse_args
from vime.cli.train_cmd import build_setup
from vime.errors import ConfigError

D = torch.float64


def loss_config(*flags: str):
    argv = ["train", "--model", "m", "--env", "vime/Math-v0", *flags]
    return build_setup(parse_args(argv)).loss


def _two_sequences():
    """Lengths 8 (A = +1) and 2 (A = -1), current = old policy (every ratio 1)."""
    mask = torch.zeros(2, 8, dtype=D)
    mask[0, :] = 1
    mask[1, :2] = 1
    adv = torch.cat([torch.ones(1, 8), -torch.ones(1, 8)]).to(D) * mask
    logprobs = torch.full((2, 8), -1.0, dtype=D) * mask
    return logprobs, adv, mask


def _loss_and_sequence_grads(config):
    logprobs, adv, mask = _two_sequences()
    x = logprobs.clone().requires_grad_(True)
    loss, _ = policy_loss(x, logprobs.clone(), adv, mask, config)
    loss.backward()
    return loss.item(), x.grad.sum(dim=1).tolist()


def test_gspo_trains_its_sequence_level_objective_by_default() -> None:
    # GSPO: J = 1/G sum_i s_i A_i with s_i = (pi/pi_old)^(1/|y_i|); at s_i = 1 the loss is
    # -(1 - 1)/2 = 0 and d(-J)/d logp_{i,t} = -A_i / (G |y_i|), summing to -A_i / G per
    # sequence: [-0.5, 0.5]. Averaging over tokens instead gives -0.6 and [-0.8, 0.2].
    config = loss_config("--policy-loss", "gspo")
    assert config.loss_agg_mode == "seq-mean-token-mean"
    loss, grads = _loss_and_sequence_grads(config)
    assert loss == pytest.approx(0.0, abs=1e-12)
    assert grads == pytest.approx([-0.5, 0.5])


def test_ppo_keeps_token_mean_by_default() -> None:
    config = loss_config()
    assert config.loss_agg_mode == "token-mean"
    loss, grads = _loss_and_sequence_grads(config)
    assert loss == pytest.approx(-0.6) and grads == pytest.approx([-0.8, 0.2])


def test_gspo_with_a_token_aggregation_is_refused_by_name_unless_allowed() -> None:
    with pytest.raises(ConfigError, match="--policy-loss gspo is defined with --loss-agg-mode "):
        loss_config("--policy-loss", "gspo", "--loss-agg-mode", "token-mean")
    with pytest.raises(ConfigError, match="add --allow-loss-agg-mismatch"):
        loss_config("--policy-loss", "gspo", "--loss-agg-mode", "seq-mean-token-sum")
    config = loss_config(
        "--policy-loss", "gspo", "--loss-agg-mode", "token-mean", "--allow-loss-agg-mismatch"
    )
    loss, grads = _loss_and_sequence_grads(config)  # what docs/algorithms.md says it means
    assert loss == pytest.approx(-0.6) and grads == pytest.approx([-0.8, 0.2])


@pytest.mark.parametrize(
    "flags,expected",
    [
        ((), (3e-4, 4e-4)),
        (("--eps-clip", "1e-3"), (1e-3, 1e-3)),
        (("--eps-clip-high", "5e-4"), (3e-4, 5e-4)),
        (("--eps-clip", "1e-3", "--eps-clip-high", "2e-3"), (1e-3, 2e-3)),
    ],
)
def test_gspo_clip_ranges_follow_one_rule_in_config_and_loss(flags, expected) -> None:
    config = loss_config("--policy-loss", "gspo", *flags)
    assert (config.clip_low, config.clip_high) == pytest.approx(expected)
    kwargs = {}
    if config.eps_clip is not None:
        kwargs["eps_low"] = config.eps_clip
    if config.eps_clip_high is not None:
        kwargs["eps_high"] = config.eps_clip_high
    # The ranges gspo_loss applies when called directly: clipped just past each threshold.
    low, high = expected
    for advantage, ratio, clipped in (
        (1.0, (1 + high) * (1 - 1e-6), False),
        (1.0, (1 + high) * (1 + 1e-6), True),
        (-1.0, (1 - low) * (1 + 1e-6), False),
        (-1.0, (1 - low) * (1 - 1e-6), True),
    ):
        lp = torch.full((1, 2), math.log(ratio), dtype=D)
        out = gspo_loss(
            lp, torch.zeros(1, 2, dtype=D), torch.full((1, 2), advantage), lp * 0 + 1, **kwargs
        )
        assert bool((out.clipped_high | out.clipped_low).all()) is clipped, (advantage, ratio)


def test_setting_eps_low_alone_gives_a_symmetric_clip_for_both_losses() -> None:
    lp = torch.full((1, 2), math.log(1.005), dtype=D)
    adv, mask, old = torch.ones(1, 2, dtype=D), torch.ones(1, 2), torch.zeros(1, 2, dtype=D)
    # eps_high follows eps_low = 0.01: a ratio of 1.005 is inside, not clipped at 4e-4
    assert not gspo_loss(lp, old, adv, mask, eps_low=0.01).clipped_high.any()
    assert not ppo_clip_loss(lp, old, adv, mask, eps_low=0.01).clipped_high.any()
    assert ppo_clip_loss(lp, old, adv, mask, eps_low=0.001).clipped_high.all()


def test_help_text_states_the_defaults_the_code_uses() -> None:
    parser = build_parser()
    text = " ".join(parser._subparsers._group_actions[0].choices["train"].format_help().split())
    for name, definition in POLICY_LOSSES.items():
        assert f"{definition.clip[0]:g} for {name}" in text
        assert f"{definition.clip[1]:g} for {name}" in text
        assert f"{definition.aggregation} for {name}" in text
        config = loss_config("--policy-loss", name)
        assert (config.clip_low, config.clip_high) == definition.clip
        assert config.loss_agg_mode == definition.aggregation


def _one_token(log_ratio: float, advantage: float, dtype=torch.float32):
    """One sampled token after a prompt token, its current/old log-ratio and advantage."""
    mask = torch.tensor([[0.0, 1.0]])
    old = torch.tensor([[0.0, -30.0]], dtype=dtype)
    logprobs = torch.tensor([[0.0, -30.0 + log_ratio]], dtype=dtype, requires_grad=True)
    return logprobs, old, torch.tensor([[0.0, advantage]], dtype=dtype), mask


@pytest.mark.parametrize("policy", ["ppo", "gspo"])
def test_a_negative_advantage_far_past_the_ratio_range_keeps_its_exact_loss(policy) -> None:
    # PPO without dual clip: loss_t = -A r_t for A < 0 and r_t > 1 - eps_low, however large,
    # with d loss / d logp_t = -A r_t. At log-ratio 22: e^22, not e^20 with zero gradient.
    # GSPO's sequence ratio of a one-token sequence is the token ratio.
    logprobs, old, adv, mask = _one_token(22.0, -1.0)
    loss, _ = policy_loss(logprobs, old, adv, mask, loss_config("--policy-loss", policy))
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(22), rel=1e-6)
    assert logprobs.grad[0, 1].item() == pytest.approx(math.exp(22), rel=1e-6)


def test_dual_clip_bounds_that_loss_with_zero_gradient() -> None:
    logprobs, old, adv, mask = _one_token(22.0, -1.0)
    loss, metrics = policy_loss(logprobs, old, adv, mask, loss_config("--eps-clip-c", "3"))
    loss.backward()
    assert loss.item() == 3.0 and logprobs.grad.abs().sum().item() == 0.0
    assert metrics["policy/clipfrac_dual"] == 1.0


@pytest.mark.parametrize("log_ratio,advantage", [(100.0, 1.0), (100.0, 0.0), (-100.0, -1.0)])
def test_extreme_ratios_of_constant_tokens_give_no_nan(log_ratio, advantage) -> None:
    # Clipped (or zero-advantage) tokens have a constant loss: exp(100) overflows float32,
    # but it must not turn their zero gradient into NaN.
    logprobs, old, adv, mask = _one_token(log_ratio, advantage)
    loss, metrics = policy_loss(logprobs, old, adv, mask, loss_config())
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logprobs.grad).all()
    assert logprobs.grad.abs().sum().item() == 0.0
    assert math.isfinite(metrics["policy/ratio_max"])
