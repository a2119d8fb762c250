"""Truncated importance sampling, sequence-level masking and mismatch metrics."""

import math

import pytest
import torch

from vime.algorithms.offpolicy import (
    mismatch_metrics,
    sequence_keep_mask,
    truncated_importance_weights,
)

D = torch.float64


def _pair(seed=0, b=3, t=8):
    g = torch.Generator().manual_seed(seed)
    trainer = -torch.rand(b, t, generator=g, dtype=D) * 3
    rollout = trainer + torch.randn(b, t, generator=g, dtype=D) * 0.5
    mask = (torch.rand(b, t, generator=g) > 0.2).long()
    return trainer, rollout, mask


def test_tis_weights_match_loop_reference():
    trainer, rollout, mask = _pair()
    got = truncated_importance_weights(trainer, rollout, mask, cap=1.5)
    for b in range(3):
        for t in range(8):
            r = math.exp(trainer[b, t].item() - rollout[b, t].item())
            expected = min(r, 1.5) if mask[b, t] else 0.0
            assert got[b, t].item() == pytest.approx(expected, abs=1e-12)


def test_tis_hand_computed_and_detached():
    trainer = torch.log(torch.tensor([[0.6, 0.9, 0.2]])).requires_grad_(True)
    rollout = torch.log(torch.tensor([[0.3, 0.9, 0.4]]))
    got = truncated_importance_weights(trainer, rollout, torch.ones(1, 3), cap=1.5)
    assert got.tolist() == [pytest.approx([1.5, 1.0, 0.5])]  # ratio 2 capped at C = 1.5
    assert not got.requires_grad
    with pytest.raises(ValueError, match="cap must be > 0, got 0"):
        truncated_importance_weights(trainer, rollout, torch.ones(1, 3), cap=0)


def test_sequence_mask_matches_loop_reference():
    trainer, rollout, mask = _pair(2, b=40, t=6)
    bounds = {"geo_low": 0.85, "geo_high": 1.2, "token_low": 0.4, "token_high": 2.5}
    got = sequence_keep_mask(trainer, rollout, mask, **bounds)
    for b in range(40):
        logs = [trainer[b, t].item() - rollout[b, t].item() for t in range(6) if mask[b, t]]
        if not logs:
            assert got[b].item()
            continue
        geo = math.exp(sum(logs) / len(logs))
        ratios = [math.exp(x) for x in logs]
        expected = (
            bounds["geo_low"] <= geo <= bounds["geo_high"]
            and min(ratios) >= bounds["token_low"]
            and max(ratios) <= bounds["token_high"]
        )
        assert got[b].item() == expected, b
    assert 5 < int(got.sum()) < 35  # the bounds keep some sequences and drop others


def test_sequence_mask_drops_by_geometric_mean_ratio():
    # per-token log-ratios; row 0 mean 0.05, row 1 mean 0.5, row 2 mean -0.5
    log_r = torch.tensor([[0.1, 0.0, 0.05], [0.5, 0.5, 0.5], [-0.5, -0.5, -0.5]], dtype=D)
    keep = sequence_keep_mask(
        log_r, torch.zeros_like(log_r), torch.ones(3, 3), geo_low=0.8, geo_high=1.2
    )
    assert keep.tolist() == [True, False, False]


def test_sequence_mask_vetoes_a_single_extreme_token():
    # geometric mean of row 1 is fine (exp(0.5 * (2.5 - 2.5)) = 1) but one token has ratio e^2.5
    log_r = torch.tensor([[0.0, 0.0], [2.5, -2.5], [0.1, -0.1]], dtype=D)
    mask = torch.ones(3, 2)
    assert sequence_keep_mask(log_r, 0 * log_r, mask, geo_low=0.5, geo_high=2).all()
    keep = sequence_keep_mask(log_r, 0 * log_r, mask, token_low=0.05, token_high=10.0)
    assert keep.tolist() == [True, False, True]
    keep_low = sequence_keep_mask(log_r, 0 * log_r, mask, token_low=0.5)
    assert keep_low.tolist() == [True, False, True]


def test_sequence_mask_ignores_unmasked_tokens_and_keeps_empty_rows():
    log_r = torch.tensor([[0.0, 9.0], [9.0, 9.0]], dtype=D)
    mask = torch.tensor([[1, 0], [0, 0]])
    keep = sequence_keep_mask(log_r, 0 * log_r, mask, geo_high=1.1, token_high=1.1)
    assert keep.tolist() == [True, True]


def test_sequence_mask_bounds_are_inclusive():
    log_r = torch.tensor([[math.log(2.0)]], dtype=D)
    keep = sequence_keep_mask(log_r, 0 * log_r, torch.ones(1, 1), geo_high=2.0 + 1e-12)
    drop = sequence_keep_mask(log_r, 0 * log_r, torch.ones(1, 1), geo_high=2.0 - 1e-12)
    assert keep.item() and not drop.item()


def test_mismatch_metrics_match_loop_reference():
    trainer, rollout, mask = _pair(1)
    got = mismatch_metrics(trainer, rollout, mask)
    diffs = [
        trainer[b, t].item() - rollout[b, t].item()
        for b in range(3)
        for t in range(8)
        if mask[b, t]
    ]
    n = len(diffs)
    assert got["mismatch/abs_diff_mean"] == pytest.approx(sum(abs(d) for d in diffs) / n)
    assert got["mismatch/abs_diff_max"] == pytest.approx(max(abs(d) for d in diffs))
    assert got["mismatch/kl_k3"] == pytest.approx(sum(math.exp(d) - 1 - d for d in diffs) / n)
    assert got["mismatch/kl_k1"] == pytest.approx(sum(-d for d in diffs) / n)


def test_mismatch_metrics_hand_computed_and_empty_mask():
    trainer = torch.tensor([[0.0, -1.0, 50.0]], dtype=D)
    rollout = torch.tensor([[0.0, -1.5, 0.0]], dtype=D)
    got = mismatch_metrics(trainer, rollout, torch.tensor([[1, 1, 0]]))
    assert got["mismatch/abs_diff_mean"] == pytest.approx(0.25)
    assert got["mismatch/abs_diff_max"] == pytest.approx(0.5)
    assert got["mismatch/kl_k3"] == pytest.approx((math.exp(0.5) - 1.5) / 2)
    empty = mismatch_metrics(trainer, rollout, torch.zeros(1, 3))
    assert set(empty.values()) == {0.0} and len(empty) == 4
