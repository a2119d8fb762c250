"""Policy/value losses and aggregation against float64 loop references and hand cases."""

import math

import pytest
import torch

from vime.algorithms.losses import (
    aggregate_loss,
    count_loss_units,
    gspo_loss,
    ppo_clip_loss,
    value_loss,
)

D = torch.float64


def _batch(seed=0, b=4, t=7):
    g = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(b, t, generator=g, dtype=D) * 3
    old = logprobs + torch.randn(b, t, generator=g, dtype=D) * 0.4
    adv = torch.randn(b, t, generator=g, dtype=D)
    mask = (torch.rand(b, t, generator=g) > 0.25).long()
    mask[0] = 1
    return logprobs, old, adv, mask


def _ppo_reference(lp, old, adv, mask, lo, hi, c):
    out = []
    for b in range(len(lp)):
        row = []
        for t in range(len(lp[b])):
            if not mask[b][t]:
                row.append(0.0)
                continue
            r, a = math.exp(lp[b][t] - old[b][t]), adv[b][t]
            loss = -min(r * a, min(max(r, 1 - lo), 1 + hi) * a)
            if c is not None and a < 0:
                loss = min(loss, -c * a)
            row.append(loss)
        out.append(row)
    return out


@pytest.mark.parametrize("lo,hi,c", [(0.2, 0.2, None), (0.2, 0.28, None), (0.1, 0.3, 1.5)])
def test_ppo_clip_matches_loop_reference(lo, hi, c):
    lp, old, adv, mask = _batch()
    got = ppo_clip_loss(lp, old, adv, mask, eps_low=lo, eps_high=hi, dual_clip=c).loss
    ref = _ppo_reference(lp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), lo, hi, c)
    assert got.tolist() == [pytest.approx(r, abs=1e-12) for r in ref]


def test_ppo_hand_computed_tokens():
    # ratios 1.5 (A=+1, clipped high at 1.2), 0.5 (A=-2, clipped low at 0.8), 1.1 (A=+1)
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.1]], dtype=D))
    out = ppo_clip_loss(
        lp, torch.zeros(1, 3, dtype=D), torch.tensor([[1.0, -2.0, 1.0]], dtype=D), torch.ones(1, 3)
    )
    assert out.loss.tolist() == [pytest.approx([-1.2, 1.6, -1.1])]
    assert out.clipped_high.tolist() == [[True, False, False]]
    assert out.clipped_low.tolist() == [[False, True, False]]


def _grad_at_ratio(ratio, advantage, **kw):
    lp = torch.tensor([[math.log(ratio)]], dtype=D, requires_grad=True)
    out = ppo_clip_loss(
        lp, torch.zeros(1, 1, dtype=D), torch.tensor([[advantage]], dtype=D), torch.ones(1, 1), **kw
    )
    out.loss.sum().backward()
    return lp.grad.item(), out


@pytest.mark.parametrize(
    "ratio,advantage,kw,flag",
    [
        (1.28, 1.0, {"eps_low": 0.2, "eps_high": 0.28}, "clipped_high"),
        (0.8, -1.0, {"eps_low": 0.2, "eps_high": 0.28}, "clipped_low"),
        (3.0, -1.0, {"eps_low": 0.2, "dual_clip": 3.0}, "clipped_dual"),
    ],
)
def test_clipping_engages_exactly_past_its_threshold(ratio, advantage, kw, flag):
    delta = 1e-9 if flag != "clipped_low" else -1e-9
    grad_in, out_in = _grad_at_ratio(ratio - delta, advantage, **kw)
    grad_out, out_out = _grad_at_ratio(ratio + delta, advantage, **kw)
    # just inside: the unclipped gradient d(-A r)/dlogp = -A r
    assert grad_in == pytest.approx(-advantage * (ratio - delta))
    assert not getattr(out_in, flag).item()
    # just outside: clipped, zero gradient
    assert grad_out == 0.0
    assert getattr(out_out, flag).item()


def test_no_clipping_where_the_ratio_moves_against_the_advantage():
    # A > 0 with a small ratio and A < 0 with a large ratio (below c) keep their gradients
    grad_pos, out_pos = _grad_at_ratio(0.5, 1.0, eps_low=0.2)
    grad_neg, out_neg = _grad_at_ratio(2.0, -1.0, eps_low=0.2, dual_clip=3.0)
    assert grad_pos == pytest.approx(-0.5)
    assert grad_neg == pytest.approx(2.0)
    for out in (out_pos, out_neg):
        assert not (out.clipped_low | out.clipped_high | out.clipped_dual).any()


@pytest.mark.parametrize("surrogate", [ppo_clip_loss, gspo_loss])
def test_masked_tokens_have_zero_loss_and_gradient(surrogate):
    lp, old, adv, mask = _batch(1)
    lp.requires_grad_(True)
    old = old.clone()
    old[mask == 0] = -math.inf  # garbage outside the mask must not leak inf/nan
    out = surrogate(lp, old, adv, mask)
    out.loss.sum().backward()
    assert torch.isfinite(out.loss).all()
    assert (out.loss[mask == 0] == 0).all() and (lp.grad[mask == 0] == 0).all()


def test_ppo_rejects_bad_clip_parameters():
    args = (torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    with pytest.raises(ValueError, match="dual clip constant c must be > 1"):
        ppo_clip_loss(*args, dual_clip=0.9)
    with pytest.raises(ValueError, match=r"eps_low must be in \[0, 1\), got 1.5"):
        ppo_clip_loss(*args, eps_low=1.5)


def _gspo_reference_loss(lp, old, adv_seq, mask, lo, hi):
    """GSPO objective written directly: mean_i -min(s_i A_i, clip(s_i) A_i)."""
    losses = []
    for b in range(lp.shape[0]):
        idx = mask[b].bool()
        s = torch.exp((lp[b][idx] - old[b][idx]).mean())
        a = adv_seq[b]
        losses.append(-torch.minimum(s * a, s.clamp(1 - lo, 1 + hi) * a))
    return torch.stack(losses).mean()


def test_gspo_value_and_gradient_equal_the_sequence_level_objective():
    lp, old, _, mask = _batch(2)
    old = lp.detach() + (old - lp) * 0.02  # ratios near 1 so both clip states occur
    adv_seq = torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=D)
    adv = adv_seq[:, None] * mask
    lo, hi = 0.003, 0.004
    x = lp.clone().requires_grad_(True)
    out = gspo_loss(x, old, adv, mask, eps_low=lo, eps_high=hi)
    got = aggregate_loss(out.loss, mask, "seq-mean-token-mean")
    got.backward()
    y = lp.clone().requires_grad_(True)
    ref = _gspo_reference_loss(y, old, adv_seq, mask, lo, hi)
    ref.backward()
    assert got.item() == pytest.approx(ref.item(), abs=1e-12)
    assert torch.allclose(x.grad, y.grad, atol=1e-12)
    clipped = (out.clipped_high | out.clipped_low).any(dim=1)
    assert clipped.any() and not clipped.all()


def test_gspo_ratio_is_the_length_normalised_sequence_ratio():
    # log-ratios 0.2 and 0.4 on two tokens (third masked): s = exp(0.3) on every masked token
    lp = torch.tensor([[0.2, 0.4, 5.0]], dtype=D)
    out = gspo_loss(
        lp,
        torch.zeros(1, 3, dtype=D),
        torch.ones(1, 3, dtype=D),
        torch.tensor([[1, 1, 0]]),
        eps_low=0.5,
        eps_high=0.5,
    )
    assert out.ratio[0, :2].tolist() == pytest.approx([math.exp(0.3)] * 2)
    assert out.loss.tolist() == [pytest.approx([-math.exp(0.3), -math.exp(0.3), 0.0])]


def _aggregate_reference(loss, mask, mode, num_tokens=None, num_seqs=None):
    rows = [[loss[b][t] for t in range(len(loss[b])) if mask[b][t]] for b in range(len(loss))]
    if mode == "token-mean":
        n = num_tokens if num_tokens is not None else sum(len(r) for r in rows)
        return sum(sum(r) for r in rows) / n
    n = num_seqs if num_seqs is not None else sum(1 for r in rows if r)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / n
    return sum(sum(r) / len(r) for r in rows if r) / n


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_aggregate_matches_loop_reference(mode):
    _, _, loss, mask = _batch(3, b=5)
    mask[4] = 0  # an empty row counts neither as tokens nor as a sequence
    got = aggregate_loss(loss, mask, mode)
    assert got.item() == pytest.approx(_aggregate_reference(loss.tolist(), mask.tolist(), mode))
    got = aggregate_loss(loss, mask, mode, num_tokens=50, num_seqs=9)
    ref = _aggregate_reference(loss.tolist(), mask.tolist(), mode, 50, 9)
    assert got.item() == pytest.approx(ref)


def test_aggregate_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate_loss(loss, mask, "token-mean").item() == 10 / 4
    assert aggregate_loss(loss, mask, "seq-mean-token-sum").item() == 10 / 2
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == (2 + 4) / 2


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_gradient_accumulation_with_global_normalisers_equals_one_batch(mode):
    lp, old, adv, mask = _batch(4, b=6, t=9)
    full = lp.clone().requires_grad_(True)
    aggregate_loss(ppo_clip_loss(full, old, adv, mask).loss, mask, mode).backward()

    micro = lp.clone().requires_grad_(True)
    slices = [slice(0, 1), slice(1, 4), slice(4, 6)]
    num_tokens = sum(count_loss_units(mask[s])[0] for s in slices)
    num_seqs = sum(count_loss_units(mask[s])[1] for s in slices)
    for s in slices:
        per_token = ppo_clip_loss(micro[s], old[s], adv[s], mask[s]).loss
        loss = aggregate_loss(per_token, mask[s], mode, num_tokens=num_tokens, num_seqs=num_seqs)
        loss.backward()
    assert torch.allclose(micro.grad, full.grad, atol=1e-14, rtol=0)


def test_aggregate_rejects_unknown_mode_and_bad_shapes():
    with pytest.raises(ValueError, match="unknown mode 'mean'"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(2, 3), "mean")
    with pytest.raises(ValueError, match=r"per_token \(2, 3\) and mask \(2, 4\)"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(2, 4))


def test_count_loss_units_skips_empty_rows():
    assert count_loss_units(torch.tensor([[1, 1, 0], [0, 0, 0], [0, 1, 0]])) == (3, 2)


def test_value_loss_matches_reference_and_hand_case():
    g = torch.Generator().manual_seed(7)
    v, old, ret = (torch.randn(3, 5, generator=g, dtype=D) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 1, 0]] * 3)
    loss, _ = value_loss(v, old, ret, mask, clip=0.2)
    for b in range(3):
        for t in range(5):
            vc = old[b, t] + min(max(v[b, t] - old[b, t], -0.2), 0.2)
            ref = (
                0.5 * max((v[b, t] - ret[b, t]) ** 2, (vc - ret[b, t]) ** 2) if mask[b, t] else 0.0
            )
            assert loss[b, t].item() == pytest.approx(float(ref), abs=1e-12)
    # V moved from 0 to 1 towards R = 2: clipped V = 0.2, loss 0.5 * 1.8^2 and clipped
    hand, hand_clipped = value_loss(
        torch.tensor([[1.0]], dtype=D),
        torch.zeros(1, 1, dtype=D),
        torch.full((1, 1), 2.0, dtype=D),
        torch.ones(1, 1),
        clip=0.2,
    )
    assert hand.item() == pytest.approx(0.5 * 1.8**2) and hand_clipped.item()
    plain, _ = value_loss(
        torch.tensor([[1.0]]),
        torch.zeros(1, 1),
        torch.full((1, 1), 2.0),
        torch.ones(1, 1),
        clip=None,
    )
    assert plain.item() == 0.5


@pytest.mark.parametrize("advantage,bound", [(1.0, 1 + 4e-4), (-1.0, 1 - 3e-4)])
def test_gspo_clips_whole_sequences_exactly_past_the_threshold(advantage, bound):
    direction = 1.0 if advantage > 0 else -1.0
    grads = {}
    for label, delta in (("inside", -1e-9), ("outside", 1e-9)):
        seq_log_ratio = math.log(bound + direction * delta)
        # two tokens whose log-ratios average to the sequence log-ratio
        lp = torch.tensor([[seq_log_ratio + 0.1, seq_log_ratio - 0.1]], dtype=D, requires_grad=True)
        out = gspo_loss(
            lp, torch.zeros(1, 2, dtype=D), torch.full((1, 2), advantage, dtype=D), torch.ones(1, 2)
        )
        aggregate_loss(out.loss, torch.ones(1, 2), "seq-mean-token-mean").backward()
        grads[label] = (lp.grad.tolist()[0], bool((out.clipped_high | out.clipped_low).any()))
    ratio_in = bound - direction * 1e-9
    assert grads["inside"][0] == pytest.approx([-advantage * ratio_in / 2] * 2)
    assert not grads["inside"][1]
    assert grads["outside"] == ([0.0, 0.0], True)
