"""Advantage estimators against plain float64 loop references and hand-computed cases."""

import math
from types import SimpleNamespace

import pytest
import torch

from vime.algorithms.advantages import (
    broadcast_to_tokens,
    compute_advantages,
    discounted_returns,
    dr_grpo_advantages,
    gae_advantages,
    grpo_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    rloo_advantages,
    whiten,
)
from vime.algorithms.config import AdvantageConfig


def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs):  # unbiased
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _rewards(seed=0, groups=4, size=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 3, (groups, size), generator=g).double() * 0.5 + torch.rand(
        groups, size, generator=g, dtype=torch.float64
    )


def test_grpo_matches_loop_reference():
    rewards = _rewards()
    got = grpo_advantages(rewards, eps=1e-6)
    for i, row in enumerate(rewards.tolist()):
        m, s = _mean(row), _std(row)
        for j, r in enumerate(row):
            assert got[i, j].item() == pytest.approx((r - m) / (s + 1e-6), abs=1e-12)


def test_grpo_hand_computed_group():
    # rewards 1, 0, 0, 1: mean 0.5, unbiased std sqrt(1/3)
    got = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64), eps=0.0)
    expected = 0.5 / math.sqrt(1 / 3)
    assert got[0].tolist() == pytest.approx([expected, -expected, -expected, expected])


@pytest.mark.parametrize(
    "estimator",
    [
        grpo_advantages,
        dr_grpo_advantages,
        rloo_advantages,
        reinforce_plus_plus_baseline_advantages,
    ],
)
def test_all_equal_rewards_in_a_group_give_exactly_zero(estimator):
    # 1/3 repeated 16 times has a float32 mean one ulp off 1/3; the advantage must still be 0
    for size in range(2, 17):
        for value in (1 / 3, 0.1, 0.7, 1.0, 0.0, -2.5):
            rewards = torch.full((2, size), value)
            rewards[1] = 1.0  # a second constant group beside it
            got = estimator(rewards)
            assert torch.equal(got, torch.zeros_like(rewards)), (size, value, got)


def test_dr_grpo_is_mean_centred_without_std():
    rewards = _rewards(1)
    got = dr_grpo_advantages(rewards)
    for i, row in enumerate(rewards.tolist()):
        assert got[i].tolist() == pytest.approx([r - _mean(row) for r in row], abs=1e-12)
    hand = dr_grpo_advantages(torch.tensor([[2.0, 0.0, 1.0]]))
    assert hand.tolist() == [[1.0, -1.0, 0.0]]


def test_grpo_rejects_ungrouped_and_singleton_groups():
    with pytest.raises(ValueError, match=r"\[num_groups, group_size\], got shape \(6,\)"):
        grpo_advantages(torch.zeros(6))
    with pytest.raises(ValueError, match="group_size=1"):
        grpo_advantages(torch.zeros(3, 1))


def test_rloo_matches_leave_one_out_loop():
    rewards = _rewards(2)
    got = rloo_advantages(rewards)
    for i, row in enumerate(rewards.tolist()):
        for j, r in enumerate(row):
            others = row[:j] + row[j + 1 :]
            assert got[i, j].item() == pytest.approx(r - _mean(others), abs=1e-12)


def test_rloo_hand_computed():
    # r = [1, 0, 0]: baselines 0, 0.5, 0.5
    got = rloo_advantages(torch.tensor([[1.0, 0.0, 0.0]]))
    assert got.tolist() == [[1.0, -0.5, -0.5]]


def test_reinforce_plus_plus_normalises_over_whole_batch():
    rewards = _rewards(3)
    got = reinforce_plus_plus_advantages(rewards, eps=1e-6)
    flat = rewards.flatten().tolist()
    m, s = _mean(flat), _std(flat)
    assert got.flatten().tolist() == pytest.approx([(r - m) / (s + 1e-6) for r in flat])
    hand = reinforce_plus_plus_advantages(torch.tensor([1.0, 3.0]), eps=0.0)
    assert hand.tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)])


def test_reinforce_plus_plus_baseline_centres_groups_then_batch_normalises():
    rewards = _rewards(4)
    got = reinforce_plus_plus_baseline_advantages(rewards, eps=1e-6)
    centred = [r - _mean(row) for row in rewards.tolist() for r in row]
    m, s = _mean(centred), _std(centred)
    assert got.flatten().tolist() == pytest.approx([(a - m) / (s + 1e-6) for a in centred])
    # groups [1, 0] and [3, 3]: centred [0.5, -0.5, 0, 0], std sqrt(1/6)
    hand = reinforce_plus_plus_baseline_advantages(torch.tensor([[1.0, 0.0], [3.0, 3.0]]), eps=0)
    k = 0.5 / math.sqrt(1 / 6)
    assert hand.flatten().tolist() == pytest.approx([k, -k, 0.0, 0.0])


def _gae_reference(rewards, values, mask, gamma, lam):
    adv = [[0.0] * len(r) for r in rewards]
    ret = [[0.0] * len(r) for r in rewards]
    for b in range(len(rewards)):
        steps = [t for t in range(len(rewards[b])) if mask[b][t]]
        next_v, next_a = 0.0, 0.0
        for t in reversed(steps):
            delta = rewards[b][t] + gamma * next_v - values[b][t]
            a = delta + gamma * lam * next_a
            adv[b][t], ret[b][t] = a, a + values[b][t]
            next_v, next_a = values[b][t], a
    return adv, ret


def test_gae_matches_loop_reference_with_env_tokens_and_padding():
    g = torch.Generator().manual_seed(5)
    rewards = torch.randn(3, 9, generator=g, dtype=torch.float64)
    values = torch.randn(3, 9, generator=g, dtype=torch.float64)
    mask = torch.tensor(
        [
            [1, 1, 1, 1, 1, 1, 1, 1, 1],
            [1, 1, 0, 0, 1, 1, 1, 0, 0],  # env tokens in the middle, then padding
            [0, 0, 1, 1, 1, 0, 0, 0, 0],
        ]
    )
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    ref_adv, ref_ret = _gae_reference(
        rewards.tolist(), values.tolist(), mask.tolist(), gamma=0.9, lam=0.8
    )
    assert adv.tolist() == [pytest.approx(r, abs=1e-12) for r in ref_adv]
    assert ret.tolist() == [pytest.approx(r, abs=1e-12) for r in ref_ret]


def test_gae_hand_computed_two_steps():
    # r = [0, 1], V = [0.5, 0.25], gamma = 1, lam = 0.5
    # delta_1 = 1 - 0.25 = 0.75, A_1 = 0.75; delta_0 = 0 + 0.25 - 0.5 = -0.25,
    # A_0 = -0.25 + 0.5 * 0.75 = 0.125; returns = A + V = [0.625, 1.0]
    adv, ret = gae_advantages(
        torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.25]]), torch.ones(1, 2), lam=0.5
    )
    assert adv.tolist() == [[0.125, 0.75]]
    assert ret.tolist() == [[0.625, 1.0]]


def test_gae_with_lambda_one_gives_returns_equal_to_discounted_rewards():
    g = torch.Generator().manual_seed(6)
    rewards = torch.randn(2, 6, generator=g, dtype=torch.float64)
    values = torch.randn(2, 6, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    _, ret = gae_advantages(rewards, values, mask, gamma=0.7, lam=1.0)
    expected = discounted_returns(rewards, mask, gamma=0.7)
    assert torch.allclose(ret, expected, atol=1e-12)


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"values \(2, 3\)"):
        gae_advantages(torch.zeros(2, 4), torch.zeros(2, 3), torch.ones(2, 4))


def test_discounted_returns_skip_unmasked_tokens():
    rewards = torch.tensor([[0.0, 5.0, 0.0, 1.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1, 1, 0]])
    got = discounted_returns(rewards, mask, gamma=0.5)
    # masked steps t=0,2,3 with rewards 0, 0, 1: G = [0.25, 0.5, 1]; unmasked rewards ignored
    assert got.tolist() == [[0.25, 0.0, 0.5, 1.0, 0.0]]


def test_whiten_uses_masked_statistics_only():
    values = torch.tensor([[1.0, 3.0, 100.0], [5.0, -50.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    got = whiten(values, mask, eps=0.0)
    # masked values 1, 3, 5: mean 3, unbiased std 2
    assert got.tolist() == [[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="at least 2 masked positions, got 1"):
        whiten(values, torch.tensor([[1, 0, 0], [0, 0, 0]]))


def test_broadcast_to_tokens_puts_sequence_value_on_masked_tokens():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    got = broadcast_to_tokens(torch.tensor([[2.0, -1.0]]), mask)
    assert got.tolist() == [[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]]
    with pytest.raises(ValueError, match="3 sequence values for a mask of 2 rows"):
        broadcast_to_tokens(torch.zeros(3), mask)


@pytest.mark.parametrize(
    "name,function",
    [
        ("grpo", grpo_advantages),
        ("dr_grpo", dr_grpo_advantages),
        ("rloo", rloo_advantages),
        ("reinforce_plus_plus", reinforce_plus_plus_advantages),
        ("reinforce_plus_plus_baseline", reinforce_plus_plus_baseline_advantages),
    ],
)
def test_compute_advantages_dispatches_by_config(name, function):
    rewards = _rewards(8)
    got = compute_advantages(rewards, AdvantageConfig(advantage_estimator=name))
    assert torch.equal(got, function(rewards))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_ragged_groups_give_each_group_its_own_size(name):
    # A group of 3 (one member dropped) beside a group of 4: the list form keeps the sizes,
    # and a group-local estimator gives each group what it gives that group alone.
    groups = [torch.tensor([1.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 0.0, 0.0])]
    got = compute_advantages(groups, AdvantageConfig(advantage_estimator=name))
    assert [g.shape[0] for g in got] == [3, 4]
    if name != "reinforce_plus_plus_baseline":
        for group, adv in zip(groups, got, strict=True):
            alone = compute_advantages(group[None], AdvantageConfig(advantage_estimator=name))
            assert torch.equal(adv, alone[0])


def test_the_registry_declares_which_estimators_need_the_whole_batch():
    from vime.algorithms.advantages import ESTIMATORS

    whole = {name for name, e in ESTIMATORS.items() if e.whole_batch}
    assert whole == {"reinforce_plus_plus", "reinforce_plus_plus_baseline"}
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'; registered: grpo"):
        compute_advantages(torch.zeros(1, 2), SimpleNamespace(advantage_estimator="gae"))
