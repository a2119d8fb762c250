"""The torch backend's chunked output path equals the materialised-logits path of the same HF
model in float32: logprobs, entropy, and every parameter's gradient (tied and untied heads)."""

from __future__ import annotations

import pytest
import torch
from trainer_data import config, make_batch

from vime.training.packing import pack_inputs, plan_micro_batches
from vime.training.torch_backend import TorchTrainer


def unfused(model, inputs, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows 0..T-2 of a packed row from full float32 logits."""
    logits = model(
        input_ids=inputs.input_ids, position_ids=inputs.position_ids, use_cache=False
    ).logits[0, :-1]
    logp = torch.log_softmax(logits / temperature, dim=-1)
    targets = inputs.input_ids[0, 1:]
    return logp.gather(-1, targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


def grads_of(model, lp: torch.Tensor, ent: torch.Tensor) -> dict[str, torch.Tensor]:
    weights = torch.linspace(-1.0, 1.0, lp.numel(), dtype=lp.dtype)
    loss = (lp * weights).sum() + 0.3 * (ent * weights.flip(0)).sum()
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("model", ["tiny_llama", "untied_qwen3"])
def test_chunked_output_equals_full_logits_values_and_gradients(model, dtype, request):
    folder = request.getfixturevalue(model)
    temperature = 0.7
    trainer = TorchTrainer(config(folder, rollout_temperature=temperature))
    trainer.model.to(dtype)
    trainer.compute_dtype = dtype
    batch = make_batch(0)
    mb = next(
        m for m in plan_micro_batches([s.num_tokens for s in batch], 80)[0] if len(m.indices) > 1
    )
    inputs = pack_inputs(batch.samples, mb)
    lp, ent = trainer._token_logprobs_and_entropy(inputs)
    assert lp.shape == ent.shape == (inputs.num_tokens - 1,)
    assert lp.dtype == ent.dtype == dtype
    got = grads_of(trainer.model, lp, ent)
    # The swapped output layer is gone again: the model's own forward gives full logits.
    want_lp, want_ent = unfused(trainer.model, inputs, temperature)
    want = grads_of(trainer.model, want_lp, want_ent)
    # float64 shows the two paths compute the same function; float32 that rounding stays
    # at float32's level (summation order differs: relative to each gradient's scale).
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(lp, want_lp, rtol=0, atol=tol)
    torch.testing.assert_close(ent, want_ent, rtol=0, atol=tol)
    assert sorted(got) == sorted(want)
    for name in want:
        scale = want[name].abs().max().item()
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=tol * scale)
