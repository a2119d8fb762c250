"""Expert parallelism on CPU (EP=2 over gloo, megatron-core through the shim) equals one
process: logprobs, loss, every parameter's full gradient and the weights after a step."""

from __future__ import annotations

import pytest
import torch
from moe_cpu import moe_step

from vime.training.launch import spawn

pytest.importorskip("megatron.core")

TOKENS = [[5, 9, 14, 3, 77, 41, 8, 60, 2, 19, 33], [4, 81, 23, 7, 7, 56, 90], [12, 6, 48, 30, 71]]


def _step(folder, args: list[str], nprocs: int = 1) -> list[dict]:
    return spawn(moe_step, nprocs, folder, args, TOKENS, backend="gloo", timeout=400)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    assert sorted(a) == sorted(b)
    return max(((a[n] - b[n]).abs().max().item(), n) for n in a)


@pytest.mark.slow
@pytest.mark.parametrize("coeff", ["0", "0.5"], ids=["no-aux", "aux"])
def test_expert_parallel_step_equals_one_process(tiny_models, coeff):
    folder = str(tiny_models["qwen3_moe"])
    args = ["--moe-aux-loss-coeff", coeff]
    single = _step(folder, args)[0]
    ranks = _step(folder, [*args, "--expert-model-parallel-size", "2"], nprocs=2)
    for rank, r in enumerate(ranks):
        for key in ("before", "after"):
            for x, y in zip(r[key], single[key], strict=True):
                torch.testing.assert_close(torch.tensor(x), torch.tensor(y), atol=1e-5, rtol=0)
        assert r["metrics"]["loss"] == pytest.approx(single["metrics"]["loss"], rel=1e-6)
        assert r["metrics"]["grad_norm"] == pytest.approx(single["metrics"]["grad_norm"], rel=1e-5)
        diff, name = _max_diff(r["grads"], single["grads"])
        assert diff < 1e-6, f"rank {rank}: gradient of {name} off by {diff:.3g}"
        diff, name = _max_diff(r["weights"], single["weights"])
        assert diff < 1e-5, f"rank {rank}: weight {name} off by {diff:.3g} after the step"
