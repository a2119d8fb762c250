"""The composed policy_loss and its LossConfig (flags, validation)."""

import argparse
import math

import pytest
import torch

from vime.algorithms import LossConfig, policy_loss
from vime.algorithms.advantages import broadcast_to_tokens, grpo_advantages
from vime.algorithms.kl import kl_estimate
from vime.algorithms.losses import aggregate_loss, count_loss_units, ppo_clip_loss
from vime.algorithms.offpolicy import truncated_importance_weights
from vime.config.schema import add_options, build
from vime.errors import ConfigError

D = torch.float64


def _batch(seed=0, b=4, t=6):
    g = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(b, t, generator=g, dtype=D) * 2
    old = logprobs + torch.randn(b, t, generator=g, dtype=D) * 0.3
    rollout = old + torch.randn(b, t, generator=g, dtype=D) * 0.1
    ref = logprobs + torch.randn(b, t, generator=g, dtype=D) * 0.2
    entropy = torch.rand(b, t, generator=g, dtype=D)
    mask = (torch.rand(b, t, generator=g) > 0.2).long()
    mask[:, 0] = 1
    adv = broadcast_to_tokens(torch.randn(b, generator=g, dtype=D), mask)
    return logprobs, old, rollout, ref, entropy, adv, mask


def test_on_policy_grpo_step_has_the_reinforce_gradient():
    # old_logprobs=None: ratio 1 everywhere, loss = -mean_t(A), d loss/d logp_t = -A_t / N
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = broadcast_to_tokens(grpo_advantages(torch.tensor([[1.0, 0.0]], dtype=D)), mask)
    lp = torch.full((2, 3), -1.0, dtype=D, requires_grad=True)
    loss, metrics = policy_loss(lp, None, adv, mask, LossConfig())
    loss.backward()
    a = 0.5 / math.sqrt(0.5) / (1 + 1e-6 / math.sqrt(0.5))  # GRPO of [1, 0] with eps 1e-6
    assert loss.item() == pytest.approx(-(3 * a - 2 * a) / 5)
    assert lp.grad.tolist() == [
        pytest.approx([-a / 5] * 3),
        pytest.approx([a / 5, a / 5, 0.0]),
    ]
    assert metrics["policy/ratio_mean"] == 1.0 and metrics["policy/clipfrac_high"] == 0.0
    assert metrics["policy/num_tokens"] == 5.0


def test_policy_loss_equals_its_parts_composed_by_hand():
    lp, old, rollout, ref, entropy, adv, mask = _batch()
    config = LossConfig(
        eps_clip=0.2,
        eps_clip_high=0.28,
        eps_clip_c=3.0,
        loss_agg_mode="seq-mean-token-mean",
        kl_loss_coef=0.1,
        entropy_coef=0.01,
        tis_cap=2.0,
    )
    x = lp.clone().requires_grad_(True)
    loss, _ = policy_loss(
        x, old, adv, mask, config, rollout_logprobs=rollout, ref_logprobs=ref, entropy=entropy
    )
    y = lp.clone().requires_grad_(True)
    pg = ppo_clip_loss(y, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=3.0).loss
    pg = pg * truncated_importance_weights(old, rollout, mask, cap=2.0)
    total = pg + 0.1 * kl_estimate(y, ref, mask, "k3") - 0.01 * entropy * mask
    expected = aggregate_loss(total, mask, "seq-mean-token-mean")
    loss.backward()
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    assert torch.allclose(x.grad, y.grad, atol=1e-12)


def test_bfloat16_inputs_are_computed_in_float32():
    lp, old, _, _, _, adv, mask = _batch(5)
    x = lp.to(torch.bfloat16).requires_grad_(True)
    loss, _ = policy_loss(x, old.to(torch.bfloat16), adv.to(torch.bfloat16), mask, LossConfig())
    loss.backward()
    assert loss.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    expected, _ = policy_loss(
        x.detach().float(),
        old.to(torch.bfloat16).float(),
        adv.to(torch.bfloat16).float(),
        mask,
        LossConfig(),
    )
    assert loss.item() == expected.item()


def test_clip_fraction_metrics_count_each_kind():
    # four tokens: clipped high, clipped low, dual clipped, unclipped
    lp = torch.log(torch.tensor([[1.5, 0.5, 4.0, 1.0]], dtype=D))
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]], dtype=D)
    config = LossConfig(eps_clip=0.2, eps_clip_c=3.0)
    _, m = policy_loss(lp, torch.zeros(1, 4, dtype=D), adv, torch.ones(1, 4), config)
    assert (m["policy/clipfrac_high"], m["policy/clipfrac_low"], m["policy/clipfrac_dual"]) == (
        0.25,
        0.25,
        0.25,
    )
    assert m["policy/ratio_max"] == pytest.approx(4.0)
    assert m["policy/ratio_mean"] == pytest.approx((1.5 + 0.5 + 4.0 + 1.0) / 4)


def test_sequence_mask_removes_rejected_sequences_but_keeps_normalisers():
    lp, old, _, _, _, adv, mask = _batch(1)
    rollout = old.clone()
    rollout[2] = old[2] - 1.0  # sequence 2: trainer/rollout ratio e on every token
    config = LossConfig(seq_mask_geo_low=0.5, seq_mask_geo_high=2.0)
    x = lp.clone().requires_grad_(True)
    loss, metrics = policy_loss(x, old, adv, mask, config, rollout_logprobs=rollout)
    loss.backward()
    assert (x.grad[2] == 0).all() and (x.grad[0] != 0).any()
    assert metrics["policy/seq_masked_frac"] == 0.25
    assert metrics["mismatch/abs_diff_max"] == pytest.approx(1.0)
    kept = mask.clone()
    kept[2] = 0
    pg = ppo_clip_loss(lp, old, adv, kept).loss
    expected = aggregate_loss(pg, kept, "token-mean", num_tokens=int(mask.sum()))
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)


def test_micro_batches_with_global_normalisers_equal_one_batch():
    lp, old, rollout, ref, _, adv, mask = _batch(2, b=6)
    config = LossConfig(loss_agg_mode="seq-mean-token-sum", kl_loss_coef=0.05, tis_cap=1.5)
    kw = {"rollout_logprobs": rollout, "ref_logprobs": ref}
    full = lp.clone().requires_grad_(True)
    policy_loss(full, old, adv, mask, config, **kw)[0].backward()
    micro = lp.clone().requires_grad_(True)
    num_tokens, num_seqs = count_loss_units(mask)
    for s in (slice(0, 2), slice(2, 5), slice(5, 6)):
        loss, _ = policy_loss(
            micro[s],
            old[s],
            adv[s],
            mask[s],
            config,
            rollout_logprobs=rollout[s],
            ref_logprobs=ref[s],
            num_tokens=num_tokens,
            num_seqs=num_seqs,
        )
        loss.backward()
    assert torch.allclose(micro.grad, full.grad, atol=1e-14, rtol=0)


def test_gspo_config_uses_the_papers_clip_ranges():
    config = LossConfig(policy_loss="gspo")
    assert (config.clip_low, config.clip_high) == (3e-4, 4e-4)
    lp, old, _, _, _, adv, mask = _batch(3)
    loss, metrics = policy_loss(lp, old, adv, mask, config)
    assert torch.isfinite(loss)
    # GSPO clips whole sequences: every token of a sequence shares its clip state
    assert metrics["policy/clipfrac_high"] + metrics["policy/clipfrac_low"] > 0


def test_missing_inputs_are_reported_with_the_flag_to_change():
    lp, old, _, _, _, adv, mask = _batch()
    with pytest.raises(ValueError, match="--tis-cap or a --seq-mask-\\* bound"):
        policy_loss(lp, old, adv, mask, LossConfig(tis_cap=2.0))
    with pytest.raises(ValueError, match=r"--kl-loss-coef=0\.1 needs ref_logprobs"):
        policy_loss(lp, old, adv, mask, LossConfig(kl_loss_coef=0.1))
    with pytest.raises(ValueError, match=r"--entropy-coef=0\.01 needs the per-token entropy"):
        policy_loss(lp, old, adv, mask, LossConfig(entropy_coef=0.01))
    with pytest.raises(ValueError, match=r"advantages has shape \(4,\)"):
        policy_loss(lp, old, adv[:, 0], mask, LossConfig())


def test_loss_config_flags_round_trip():
    parser = argparse.ArgumentParser()
    add_options(parser, LossConfig)
    args = parser.parse_args(
        ["--eps-clip-high", "0.28", "--loss-agg-mode", "seq-mean-token-sum", "--tis-cap", "2"]
    )
    config = build(LossConfig, args)
    assert (config.clip_low, config.clip_high, config.tis_cap) == (0.2, 0.28, 2.0)
    assert config.loss_agg_mode == "seq-mean-token-sum"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"eps_clip": 1.2}, r"--eps-clip must be in \[0, 1\), got 1.2"),
        ({"eps_clip_c": 1.0}, "--eps-clip-c \\(dual clip\\) must be > 1, got 1.0"),
        ({"kl_loss_coef": -1.0}, "--kl-loss-coef must be >= 0"),
        ({"seq_mask_geo_low": 2.0, "seq_mask_geo_high": 1.5}, "--seq-mask-geo-low=2.0 is above"),
    ],
)
def test_loss_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LossConfig(**kwargs)
