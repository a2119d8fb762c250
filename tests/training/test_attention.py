"""SDPA core attention: grouped key/value heads handed to SDPA as they are (``enable_gqa``, the
CUDA default) give the same outputs and gradients as heads repeated to the query's count, and
both equal causal attention written out from its definition."""

from __future__ import annotations

import math

import pytest
import torch

from vime.training.megatron.model import causal_sdpa


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v, each query head reading key/value head
    ``h // (heads / groups)``; ``[b, s, h, d]`` in and out."""
    _, s, h, d = q.shape
    group = torch.arange(h) // (h // k.shape[2])
    kk, vv = k[:, :, group], v[:, :, group]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kk) / math.sqrt(d)
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs, vv)


@pytest.mark.parametrize("heads,groups", [(8, 2), (4, 4), (6, 1)])
def test_grouped_and_repeated_heads_agree_with_the_definition(heads: int, groups: int) -> None:
    gen = torch.Generator().manual_seed(heads * 10 + groups)
    q = torch.randn(2, 7, heads, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 7, groups, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 7, groups, 16, generator=gen, dtype=torch.float64)
    grad_out = torch.randn(2, 7, heads, 16, generator=gen, dtype=torch.float64)

    results = {}
    for name, fn in {
        "gqa": lambda a, b, c: causal_sdpa(a, b, c, gqa=True),
        "repeat": lambda a, b, c: causal_sdpa(a, b, c, gqa=False),
        "reference": reference,
    }.items():
        leaves = [t.clone().float().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)
        out.backward(grad_out.float())
        results[name] = (out.detach(), *(t.grad for t in leaves))

    for name in ("gqa", "repeat"):
        for got, want in zip(results[name], results["reference"], strict=True):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    for got, want in zip(results["gqa"], results["repeat"], strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_default_repeats_on_cpu_and_keeps_the_layout() -> None:
    q = torch.randn(1, 5, 4, 8)
    k = torch.randn(1, 5, 2, 8)
    out = causal_sdpa(q, k, k.clone())
    assert out.shape == (1, 5, 4, 8)
    torch.testing.assert_close(out, causal_sdpa(q, k, k.clone(), gqa=True), atol=1e-6, rtol=0)
