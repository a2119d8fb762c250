"""The chunked output-layer logprobs equal the unfused path: values and gradients."""

from __future__ import annotations

import pytest
import torch
from output_logprobs_data import grads, inputs, reference, vocab_parallel_grads

from vime.training.launch import spawn
from vime.training.output_logprobs import token_logprobs_and_entropy

F64 = torch.float64


@pytest.mark.parametrize("chunk", [1, 8, 37, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_unfused_path_in_float64(chunk, temperature):
    def ours(h, w, t):
        return token_logprobs_and_entropy(h, w, t, temperature=temperature, chunk_tokens=chunk)

    got = grads(ours, *inputs(dtype=F64))
    want = grads(lambda h, w, t: reference(h, w, t, temperature), *inputs(dtype=F64))
    for a, b in zip(got, want, strict=True):
        assert a.dtype == F64
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_float32_values_and_gradients_match_a_float64_reference():
    got = grads(lambda h, w, t: token_logprobs_and_entropy(h, w, t, chunk_tokens=8), *inputs())
    want = grads(reference, *inputs(dtype=F64))
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_an_unused_entropy_adds_no_gradient():
    data = inputs(seed=1, dtype=F64)
    got = grads(lambda h, w, t: token_logprobs_and_entropy(h, w, t, chunk_tokens=5), *data, False)
    want = grads(reference, *data, use_entropy=False)
    torch.testing.assert_close(got[2], want[2], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got[3], want[3], rtol=1e-12, atol=1e-12)


def test_entropy_alone_has_the_entropy_gradient():
    hidden, weight, targets, _, coef = inputs(seed=2, dtype=F64)
    _, ent = token_logprobs_and_entropy(hidden, weight, targets, chunk_tokens=4)
    got = torch.autograd.grad((ent * coef).sum(), hidden)[0]
    _, ref_ent = reference(hidden, weight, targets)
    want = torch.autograd.grad((ref_ent * coef).sum(), hidden)[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_bf16_matmuls_give_float32_outputs_close_to_the_bf16_unfused_path():
    hidden, weight, targets, _, _ = inputs(n=64, h=32, v=300, seed=3)
    hb, wb = hidden.detach().bfloat16(), weight.detach().bfloat16()
    lp, ent = token_logprobs_and_entropy(hb, wb, targets, chunk_tokens=16)
    assert lp.dtype == ent.dtype == torch.float32
    # The unfused bf16 path: bf16 logits, upcast, float32 log-softmax.
    logp = torch.log_softmax((hb @ wb.t()).float(), dim=-1)
    ref_lp, ref_ent = logp.gather(1, targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-4)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-4)


def test_bad_shapes_are_refused_with_the_shapes():
    h = torch.zeros(4, 8)
    with pytest.raises(ValueError, match=r"\(4, 8\) and \(10, 7\)"):
        token_logprobs_and_entropy(h, torch.zeros(10, 7), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="3 targets for 4 rows"):
        token_logprobs_and_entropy(h, torch.zeros(10, 8), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature > 0"):
        token_logprobs_and_entropy(
            h, torch.zeros(10, 8), torch.zeros(4, dtype=torch.long), temperature=0
        )


def test_a_vocab_parallel_output_layer_over_two_ranks_equals_one_rank():
    results = spawn(vocab_parallel_grads, 2, 54, 10, timeout=120)
    hidden, weight, targets, coef_lp, coef_ent = inputs(v=54, seed=4, dtype=F64)
    want_lp, want_ent, want_gh, want_gw = grads(
        reference, hidden, weight, targets, coef_lp, coef_ent
    )
    for rank, (lp, ent, gh, gw) in enumerate(results):
        torch.testing.assert_close(lp, want_lp, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ent, want_ent, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gh, want_gh, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gw, want_gw[rank * 27 : (rank + 1) * 27], rtol=1e-12, atol=1e-12)


def test_rows_score_only_those_positions_with_the_unfused_values_and_gradients():
    hidden, weight, targets, coef_lp, coef_ent = inputs(seed=5, dtype=F64)
    rows = torch.tensor([0, 3, 4, 5, 19, 36])
    lp, ent = token_logprobs_and_entropy(hidden, weight, targets, chunk_tokens=4, rows=rows)
    gh, gw = torch.autograd.grad((lp * coef_lp).sum() + (ent * coef_ent).sum(), (hidden, weight))
    ref_lp, ref_ent = reference(hidden, weight, targets)
    keep = torch.zeros(hidden.shape[0], dtype=torch.bool)
    keep[rows] = True
    ref_lp, ref_ent = ref_lp.where(keep, 0.0), ref_ent.where(keep, 0.0)
    want_gh, want_gw = torch.autograd.grad(
        (ref_lp * coef_lp).sum() + (ref_ent * coef_ent).sum(), (hidden, weight)
    )
    assert (lp[~keep] == 0).all() and (ent[~keep] == 0).all()
    assert (gh[~keep] == 0).all()  # an unscored row gets no gradient
    for a, b in ((lp, ref_lp), (ent, ref_ent), (gh, want_gh), (gw, want_gw)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_bad_rows_are_refused_with_the_range():
    h, w, t = torch.zeros(4, 8), torch.zeros(10, 8), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"rows must lie in 0 \.\. 3, got 1 \.\. 4"):
        token_logprobs_and_entropy(h, w, t, rows=torch.tensor([1, 4]))
    with pytest.raises(ValueError, match="1-D int64"):
        token_logprobs_and_entropy(h, w, t, rows=torch.tensor([1.0]))
