"""The trainers' attention on a CUDA device, in bf16, against float32 attention of each
sequence whole: packed sequences and shared prompts (grouped key/value heads as Qwen3 has
them) must be as close as torch's own kernel choice is. Skipped without a GPU; run them on the
device machine with ``python3 -m pytest tests/training/test_attention_cuda.py``."""

from __future__ import annotations

import itertools

import pytest
import torch

from vime.training import attention
from vime.training.attention import causal_sdpa, packed_causal_sdpa

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _inputs(heads: int, groups: int, bounds: list[int], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = bounds[-1]
    return [
        torch.randn(1, total, h, 128, generator=gen, device="cuda")
        for h in (heads, groups, groups, heads)
    ]


def _whole(q, k, v, grad, bounds, parents):
    """Each segment attended as one sequence (its parent's tokens first), float32; returns the
    output and the gradients of q, k, v."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = torch.zeros_like(q)
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        p = parents[i]
        idx = torch.arange(a, b, device="cuda")
        if p >= 0:
            idx = torch.cat([torch.arange(bounds[p], bounds[p + 1], device="cuda"), idx])
        o = causal_sdpa(*(t[:, idx] for t in leaves), gqa=False)[:, -(b - a) :]
        out[:, a:b] = o.detach()
        (o * grad[:, a:b]).sum().backward()
    return [out, *(t.grad for t in leaves)]


def _packed(q, k, v, grad, bounds, parents):
    leaves = [t.detach().clone().to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
    out = packed_causal_sdpa(*leaves, bounds, parents=parents)
    (out * grad.to(torch.bfloat16)).sum().backward()
    return [out.detach().float(), *(t.grad.float() for t in leaves)]


@pytest.mark.parametrize(
    ("sizes", "parents"),
    [
        ([700, 1300, 96], [-1, -1, -1]),
        ([256, 900, 1500, 37, 640], [-1, 0, 0, 0, -1]),
        ([2100, 300, 4096], [-1, -1, -1]),  # cuDNN for the long ones, 2100 padded to 2304
    ],
    ids=["packed", "shared", "long"],
)
def test_bf16_attention_is_as_close_to_fp32_as_torchs_own_choice(monkeypatch, sizes, parents):
    bounds = [0, *itertools.accumulate(sizes)]
    q, k, v, grad = _inputs(16, 8, bounds, seed=len(parents) + len(sizes))
    want = _whole(q, k, v, grad, bounds, parents)
    ours = _packed(q, k, v, grad, bounds, parents)
    monkeypatch.setattr(attention, "CUDA_SDPA_BACKENDS", None)  # torch's kernel, unpadded
    monkeypatch.setattr(attention, "CUDNN_FROM", None)
    torchs = _packed(q, k, v, grad, bounds, parents)
    for name, got, base, ref in zip(("out", "dq", "dk", "dv"), ours, torchs, want, strict=True):
        err, base_err = (got - ref).abs().max().item(), (base - ref).abs().max().item()
        scale = ref.abs().max().item()
        print(f"{name}: ours {err:.3g}, torch's choice {base_err:.3g}, |ref| {scale:.3g}")
        assert err <= 1.25 * base_err + 1e-3 * scale, (name, err, base_err)


def test_a_shared_prompt_reads_grouped_heads_through_flash(monkeypatch):
    calls = []
    flash = torch.ops.aten._scaled_dot_product_flash_attention

    def spy(q, k, v, *args, **kwargs):
        calls.append((q.shape[1], k.shape[1]))
        return flash(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_flash_attention", spy)
    bounds = [0, 64, 192, 256]
    q, k, v, _ = (t.to(torch.bfloat16) for t in _inputs(16, 8, bounds, seed=3))
    packed_causal_sdpa(q, k, v, bounds, parents=[-1, 0, 0])
    assert calls == [(16, 8), (16, 8)]  # the two continuations; the prompt itself is plain causal


def test_long_sequences_go_to_cudnn_padded_to_a_bucket(monkeypatch):
    calls = []
    cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention

    def spy(q, k, v, *args, **kwargs):
        calls.append((q.shape[1], k.shape[1], q.shape[2]))
        return cudnn(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", spy)
    bounds = [0, 2100, 2400, 6496]
    q, k, v, _ = (t.to(torch.bfloat16).requires_grad_() for t in _inputs(16, 8, bounds, seed=4))
    out = packed_causal_sdpa(q, k, v, bounds)
    assert out.shape == q.shape
    out.sum().backward()
    assert calls == [(16, 8, 2304), (16, 8, 4096)]  # 300 tokens: flash, not cuDNN
    calls.clear()
    monkeypatch.setattr(attention, "CUDNN_FROM", None)
    packed_causal_sdpa(q, k, v, bounds)
    assert calls == []
