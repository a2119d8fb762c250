"""KL estimators, entropy from logits and DAPO overlong shaping."""

import math

import pytest
import torch

from vime.algorithms.kl import (
    entropy_from_logits,
    kl_estimate,
    kl_penalized_rewards,
    overlong_penalty,
)

D = torch.float64


def test_kl_estimators_hand_computed():
    # log pi - log pi_ref = log 2 on the one masked token
    lp = torch.tensor([[math.log(0.5), 0.0]], dtype=D)
    ref = torch.tensor([[math.log(0.25), -3.0]], dtype=D)
    mask = torch.tensor([[1, 0]])
    x = math.log(2)
    assert kl_estimate(lp, ref, mask, "k1").tolist() == [pytest.approx([x, 0.0])]
    assert kl_estimate(lp, ref, mask, "k2").tolist() == [pytest.approx([x * x / 2, 0.0])]
    assert kl_estimate(lp, ref, mask, "k3").tolist() == [pytest.approx([x - 0.5, 0.0])]


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_match_loop_reference(estimator):
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(3, 6, generator=g, dtype=D) * 4
    ref = -torch.rand(3, 6, generator=g, dtype=D) * 4
    mask = (torch.rand(3, 6, generator=g) > 0.3).long()
    got = kl_estimate(lp, ref, mask, estimator)
    formulas = {
        "k1": lambda x: x,
        "k2": lambda x: x * x / 2,
        "k3": lambda x: math.exp(-x) - 1 + x,
    }
    for b in range(3):
        for t in range(6):
            x = lp[b, t].item() - ref[b, t].item()
            expected = formulas[estimator](x) if mask[b, t] else 0.0
            assert got[b, t].item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_k1_and_k3_are_unbiased_for_the_exact_kl(estimator):
    # Expectation over y ~ p of the estimator, computed exactly over the whole vocabulary.
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=D)
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=D)
    per_token = kl_estimate(p.log()[None], q.log()[None], torch.ones(1, 4), estimator)[0]
    exact = float((p * (p / q).log()).sum())
    assert float((p * per_token).sum()) == pytest.approx(exact, abs=1e-12)


def test_k3_is_never_negative_and_unknown_estimator_is_rejected():
    g = torch.Generator().manual_seed(1)
    lp, ref = torch.randn(4, 50, generator=g), torch.randn(4, 50, generator=g)
    assert (kl_estimate(lp, ref, torch.ones(4, 50), "k3") >= 0).all()
    with pytest.raises(ValueError, match="unknown estimator 'k4'"):
        kl_estimate(lp, ref, torch.ones(4, 50), "k4")


def test_kl_penalized_rewards_subtract_detached_kl_on_masked_tokens():
    lp = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    got = kl_penalized_rewards(rewards, lp, ref, torch.tensor([[1, 1, 0]]), coef=0.1)
    assert got.tolist() == [pytest.approx([-0.1, 0.0, 0.0])]
    assert not got.requires_grad


def _entropy_reference(logits):
    out = []
    for row in logits.tolist():
        m = max(row)
        z = sum(math.exp(v - m) for v in row)
        ps = [math.exp(v - m) / z for v in row]
        out.append(-sum(p * math.log(p) for p in ps if p > 0))
    return out


def test_entropy_matches_loop_reference_and_uniform_case():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 11, generator=g) * 3
    got = entropy_from_logits(logits)
    assert got.shape == (2, 3)
    ref = _entropy_reference(logits.reshape(-1, 11).double())
    assert got.flatten().tolist() == pytest.approx(ref, abs=1e-5)
    uniform = entropy_from_logits(torch.zeros(1, 7))
    assert uniform.item() == pytest.approx(math.log(7), abs=1e-6)


def test_chunked_entropy_equals_one_chunk_in_value_and_gradient():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(4, 9, 13, generator=g)
    a = base.clone().requires_grad_(True)
    b = base.clone().requires_grad_(True)
    ea = entropy_from_logits(a, chunk_size=None)
    eb = entropy_from_logits(b, chunk_size=5)  # 36 rows in 8 chunks, the last one short
    assert torch.allclose(ea, eb, atol=1e-6)
    (ea * torch.arange(36.0).reshape(4, 9)).sum().backward()
    (eb * torch.arange(36.0).reshape(4, 9)).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-5)


def test_entropy_gradient_passes_gradcheck():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(5, 6, generator=g, dtype=D, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits(z, chunk_size=2), (logits,))


def test_entropy_ignores_masked_vocabulary_entries():
    logits = torch.tensor([[0.0, 0.0, float("-inf")]], requires_grad=True)
    h = entropy_from_logits(logits)
    h.sum().backward()
    assert h.item() == pytest.approx(math.log(2))
    assert torch.isfinite(logits.grad).all()
    with pytest.raises(ValueError, match="chunk_size must be >= 1 or None, got 0"):
        entropy_from_logits(logits, chunk_size=0)


def test_overlong_penalty_hand_computed():
    # max 10, buffer 4: free up to 6, linear to -1 at 10, -1 beyond
    lengths = torch.tensor([1, 6, 7, 8, 10, 11, 100])
    got = overlong_penalty(lengths, max_length=10, buffer_length=4)
    assert got.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    scaled = overlong_penalty(torch.tensor([9]), max_length=10, buffer_length=4, penalty_factor=2)
    assert scaled.tolist() == [-1.5]


def test_overlong_penalty_matches_loop_reference():
    lengths = torch.arange(0, 40, dtype=D)
    got = overlong_penalty(lengths, max_length=30, buffer_length=7)
    for n, value in zip(range(40), got.tolist(), strict=True):
        expected = 0.0 if n <= 23 else ((23 - n) / 7 if n <= 30 else -1.0)
        assert value == pytest.approx(expected, abs=1e-12)


def test_overlong_penalty_rejects_a_buffer_longer_than_the_limit():
    with pytest.raises(ValueError, match="buffer_length=20, max_length=10"):
        overlong_penalty(torch.tensor([1]), max_length=10, buffer_length=20)
