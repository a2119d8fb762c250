"""Qwen3-MoE in the Megatron backend on CPU (fp32, megatron-core through the shim): the routers'
load-balancing loss reaches the gradient as the Switch/GShard formula says, weighted as
``--moe-aux-loss-coeff`` documents."""

from __future__ import annotations

import pytest
import torch
from moe_cpu import moe_step

from vime.training.launch import spawn

pytest.importorskip("megatron.core")

TOKENS = [[5, 9, 14, 3, 77, 41, 8, 60, 2, 19, 33], [4, 81, 23, 7, 7, 56, 90], [12, 6, 48, 30, 71]]
COEFF = 0.5


def _step(folder, args: list[str], nprocs: int = 1) -> list[dict]:
    return spawn(moe_step, nprocs, folder, args, TOKENS, backend="gloo", timeout=400)


@pytest.fixture(scope="module")
def aux_runs(tiny_models) -> dict[str, dict]:
    """One process's step without the flag, and with coefficients 0, COEFF and 2 * COEFF."""
    folder = str(tiny_models["qwen3_moe"])
    coeffs = {"0": 0.0, "c": COEFF, "2c": 2 * COEFF}
    runs = {k: _step(folder, ["--moe-aux-loss-coeff", str(v)])[0] for k, v in coeffs.items()}
    runs["absent"] = _step(folder, [])[0]
    return runs


def switch_aux_gradient(folder: str, coeff: float) -> dict[str, torch.Tensor]:
    """The gradient of ``coeff * sum over layers and sequences of (T_seq / T) * aux`` on the HF
    model, by the Switch/GShard formula ``aux = E * sum_i f_i * P_i``: ``f_i`` the share of the
    sequence's top-k assignments that go to expert i (not differentiated), ``P_i`` the mean
    softmax probability of expert i over its tokens. Under Megatron names."""
    from transformers import AutoModelForCausalLM

    from vime.training.megatron.arch import arch_from_hf_config
    from vime.training.megatron.convert import hf_to_megatron

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    experts, topk = model.config.num_experts, model.config.num_experts_per_tok
    total = sum(len(ids) for ids in TOKENS)
    objective = torch.zeros(())
    for ids in TOKENS:
        out = model(input_ids=torch.tensor([ids]), output_router_logits=True)
        assert len(out.router_logits) == model.config.num_hidden_layers
        for logits in out.router_logits:
            probs = torch.softmax(logits.reshape(len(ids), experts).float(), dim=-1)
            chosen = probs.topk(topk, dim=-1).indices
            f = torch.bincount(chosen.flatten(), minlength=experts).float() / (len(ids) * topk)
            aux = experts * (f * probs.mean(dim=0)).sum()
            objective = objective + coeff * len(ids) / total * aux
    objective.backward()
    grads = {
        n: (p.grad if p.grad is not None else torch.zeros_like(p))
        for n, p in model.named_parameters()
    }
    return hf_to_megatron(grads, arch_from_hf_config(model.config))


def _diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    assert sorted(a) == sorted(b)
    return {n: a[n] - b[n] for n in a}


@pytest.mark.slow
def test_aux_loss_gradient_is_the_switch_formula(aux_runs, tiny_models):
    expected = switch_aux_gradient(str(tiny_models["qwen3_moe"]), COEFF)
    added = _diff(aux_runs["c"]["grads"], aux_runs["0"]["grads"])
    assert sorted(added) == sorted(expected)
    # The router's own weights and everything upstream of a router get the aux gradient.
    routers = [n for n in expected if n.endswith("mlp.router.weight")]
    assert len(routers) == 2 and all(expected[n].abs().max() > 1e-4 for n in routers)
    for name, grad in expected.items():
        torch.testing.assert_close(added[name], grad, atol=2e-6, rtol=1e-4, msg=name)
    # The reported loss is the policy loss alone, the same with or without the aux term.
    assert aux_runs["c"]["metrics"]["loss"] == aux_runs["0"]["metrics"]["loss"]


@pytest.mark.slow
def test_aux_coefficient_scales_it_and_zero_is_the_flag_absent(aux_runs):
    once = _diff(aux_runs["c"]["grads"], aux_runs["0"]["grads"])
    twice = _diff(aux_runs["2c"]["grads"], aux_runs["0"]["grads"])
    for name in once:
        torch.testing.assert_close(twice[name], 2 * once[name], atol=2e-6, rtol=1e-4, msg=name)
    assert max(t.abs().max().item() for t in once.values()) > 1e-4
    # Coefficient 0 is the default: the same step, bit for bit.
    zero, absent = aux_runs["0"], aux_runs["absent"]
    timing = ("step_time_s", "tokens_per_s")
    assert {k: v for k, v in zero["metrics"].items() if k not in timing} == {
        k: v for k, v in absent["metrics"].items() if k not in timing
    }
    for key in ("grads", "weights"):
        for name, tensor in zero[key].items():
            assert torch.equal(tensor, absent[key][name]), (key, name)
