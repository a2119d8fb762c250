"""Tensor and data parallelism on CPU (2 processes over gloo, megatron-core through the shim):
both give the single-process logprobs, gradients, grad norm, updated weights and export."""

from __future__ import annotations

import pytest
import torch
from megatron_cpu import run_one_step, run_per_sequence

from vime.training.launch import spawn

pytest.importorskip("megatron.core")

TP2 = ["--tensor-model-parallel-size", "2"]
TOKENS = [[5, 9, 14, 3, 77, 41, 8, 60, 2, 19, 33], [4, 81, 23, 7, 7, 56, 90], [12, 6, 48, 30, 71]]


@pytest.fixture(scope="module")
def single(tiny_models) -> dict:
    """The one-process reference run (spawned too, so its process groups stay its own)."""
    return spawn(run_per_sequence, 1, str(tiny_models["qwen2"]), [], TOKENS, backend="gloo")[0]


def _close(a: list[list[float]], b: list[list[float]]) -> bool:
    return all(
        torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-5)
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--tensor-model-parallel-size", "2"], []], ids=["tp2", "dp2"])
def test_two_processes_match_one(tiny_models, single, args):
    ranks = spawn(
        run_per_sequence, 2, str(tiny_models["qwen2"]), args, TOKENS, backend="gloo", timeout=400
    )
    for r in ranks:
        assert _close(r["before"], single["before"])
        assert r["metrics"]["loss"] == pytest.approx(single["metrics"]["loss"], rel=1e-6)
        assert _close(r["after"], single["after"])
        assert r["metrics"]["grad_norm"] == pytest.approx(single["metrics"]["grad_norm"], rel=1e-5)
    if not args:
        # Sequences of 11 | 7, 5 tokens, one per micro-batch: rank 0 fills with a dummy.
        assert [r["dummies"] for r in ranks] == [[False, True], [False, False]]
    # Rank 0 receives the full HF tensors; the other rank none.
    assert ranks[1]["exported"] == {}
    assert sorted(ranks[0]["exported"]) == sorted(single["exported"])
    for name, tensor in single["exported"].items():
        assert torch.equal(ranks[0]["exported"][name], tensor), name


@pytest.fixture(scope="module")
def tp_runs(tiny_models) -> dict[str, tuple[dict, list[dict]]]:
    """Per family: one train step in one process and the same step at TP=2 (both ranks)."""
    runs = {}
    for family in ("llama", "qwen2", "qwen3"):
        folder = str(tiny_models[family])
        single = spawn(run_one_step, 1, folder, [], TOKENS, backend="gloo", timeout=400)[0]
        tp2 = spawn(run_one_step, 2, folder, TP2, TOKENS, backend="gloo", timeout=400)
        runs[family] = (single, tp2)
    return runs


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    assert sorted(a) == sorted(b)
    return max(((a[n] - b[n]).abs().max().item(), n) for n in a)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_tensor_parallel_step_equals_one_process(tp_runs, family):
    single, ranks = tp_runs[family]
    for rank, r in enumerate(ranks):
        # Every parameter's full gradient, as handed to the optimizer, is one process's.
        diff, name = _max_diff(r["grads"], single["grads"])
        assert diff < 1e-6, f"rank {rank}: gradient of {name} off by {diff:.3g}"
        # The norm that clipping uses counts every parameter once.
        assert r["metrics"]["grad_norm"] == pytest.approx(single["metrics"]["grad_norm"], rel=1e-6)
        assert r["metrics"]["loss"] == pytest.approx(single["metrics"]["loss"], rel=1e-6)
        # After the step every rank holds one process's weights, up to what Adam makes of the
        # gradients' last bits. Its first step moves a weight by lr * g / (|g| + eps) (bias
        # correction cancels), whose slope in g is lr * eps / (|g| + eps)^2: tiny for ordinary
        # gradients, but near |g| ~ eps a 1e-9 gradient difference moves the weight by ~1e-5.
        # So each weight may differ by that slope times its own gradient difference (clipping
        # scales both), never by more than the two steps apart, plus float32 rounding.
        lr, eps, clip = 1e-3, 1e-8, 1.0
        scale = min(1.0, clip / (single["metrics"]["grad_norm"] + 1e-6))
        for name, w in r["weights"].items():
            g = single["grads"][name] * scale
            dg = (r["grads"][name] - single["grads"][name]).abs() * scale
            bound = torch.clamp(2 * lr * eps * dg / (g.abs() + eps) ** 2, max=2 * lr) + 1e-6
            excess = (w - single["weights"][name]).abs() - bound
            assert excess.max().item() <= 0, (
                f"rank {rank}: weight {name} off by {excess.max().item():.3g} beyond "
                "what Adam makes of the gradient difference"
            )
    # Replicated weights (norms) stay bit-identical across TP ranks.
    for name, tensor in ranks[0]["weights"].items():
        assert torch.equal(tensor, ranks[1]["weights"][name]), name
