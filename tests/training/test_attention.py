"""Causal attention of both backends: grouped key/value heads handed to SDPA as they are
(``enable_gqa``, the CUDA default) equal heads repeated to the query's count and attention
written out from its definition; packed sequences attend only within themselves, and the
transformers ``packed_sdpa`` implementation equals transformers' own block-masked SDPA."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from vime.training.attention import (
    CPU_FP32_ATTENTION_BELOW,
    HF_PACKED_SDPA,
    causal_sdpa,
    hf_packed_sdpa,
    packed_causal_sdpa,
    padded_causal,
    register_hf_attention,
)


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


def test_packed_sequences_attend_only_within_themselves() -> None:
    gen = torch.Generator().manual_seed(7)
    bounds = [0, 5, 6, 13]
    q, k, v = (torch.randn(1, 13, h, 8, generator=gen) for h in (4, 2, 2))
    out = packed_causal_sdpa(q, k, v, bounds)
    # [1, T, h, d] laid out in that order: flattening the heads is a view, not a copy.
    assert out.shape == (1, 13, 4, 8) and out.is_contiguous()
    for a, b in itertools.pairwise(bounds):
        alone = reference(q[:, a:b], k[:, a:b], v[:, a:b])
        torch.testing.assert_close(out[:, a:b], alone, atol=2e-6, rtol=1e-5)
    # Changing the first sequence leaves the others' outputs exactly as they were.
    k2 = k.clone()
    k2[:, :5] += 1.0
    again = packed_causal_sdpa(q, k2, v, bounds)
    assert torch.equal(again[:, 5:], out[:, 5:]) and not torch.equal(again[:, :5], out[:, :5])


@pytest.mark.parametrize(
    "bounds,match",
    [([0, 5], "do not cover the 13 tokens"), ([1, 13], "do not cover"), ([0], "do not cover")],
)
def test_packed_bounds_must_cover_the_row(bounds, match) -> None:
    q = torch.randn(1, 13, 2, 8)
    with pytest.raises(ValueError, match=match):
        packed_causal_sdpa(q, q, q, bounds)


def test_packed_gradients_equal_each_sequence_alone() -> None:
    """The split row's backward (one concatenation) gives every sequence the gradients of the
    definition applied to it alone, and nothing across sequences."""
    gen = torch.Generator().manual_seed(11)
    bounds = [0, 4, 5, 12, 20]
    q, k, v = (torch.randn(1, 20, h, 8, generator=gen, dtype=torch.float64) for h in (4, 2, 2))
    grad_out = torch.randn(1, 20, 4, 8, generator=gen, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    packed_causal_sdpa(*leaves, bounds).backward(grad_out)
    for a, b in itertools.pairwise(bounds):
        alone = [t[:, a:b].clone().requires_grad_() for t in (q, k, v)]
        reference(*alone).backward(grad_out[:, a:b])
        for got, want in zip(leaves, alone, strict=True):
            torch.testing.assert_close(got.grad[:, a:b], want.grad, atol=1e-10, rtol=1e-10)


def test_packed_bounds_must_not_hold_an_empty_sequence() -> None:
    q = torch.randn(1, 6, 2, 8)
    with pytest.raises(ValueError, match="empty sequence"):
        packed_causal_sdpa(q, q, q, [0, 3, 3, 6])


@pytest.mark.parametrize("autocast", [False, True], ids=["half-inputs", "fp32-under-autocast"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_short_half_precision_sequences_attend_in_fp32_on_cpu(
    dtype: torch.dtype, autocast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below CPU_FP32_ATTENTION_BELOW tokens a sequence that would attend in half precision
    (its dtype, or CPU autocast's, as the torch backend runs) is computed in fp32, forward and
    backward, and rounded once; from it on, in the half-precision dtype as before."""
    gen = torch.Generator().manual_seed(5)
    short, long = 37, CPU_FP32_ATTENTION_BELOW
    bounds = [0, short, short + long]
    q, k, v = (torch.randn(1, short + long, h, 64, generator=gen) for h in (6, 2, 2))
    grad_out = torch.randn(1, short + long, 6, 64, generator=gen)

    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((q.shape[2], q.dtype, k.dtype, v.dtype))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    half = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    leaves = [t.detach().float().requires_grad_() for t in half] if autocast else half
    with torch.autocast("cpu", dtype=dtype, enabled=autocast):
        out = packed_causal_sdpa(*leaves, bounds)
    out.backward(grad_out.to(dtype))
    f32 = torch.float32
    assert calls[0] == (short, f32, f32, f32)
    assert calls[1][0] == long and (calls[1][1:] == (f32,) * 3 if autocast else (dtype,) * 3)
    assert out.dtype == dtype and all(t.grad.dtype == leaves[0].dtype for t in leaves)

    # The short sequence: the fp32 computation from the same rounded inputs, rounded once.
    wide = [t.detach().float() for t in half]
    assert torch.equal(out[:, :short], causal_sdpa(*(t[:, :short] for t in wide)).to(dtype))


def tiny_qwen3(attn: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    register_hf_attention()
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        attn_implementation=attn,
    )
    return Qwen3ForCausalLM(config).eval()


def test_hf_packed_sdpa_equals_transformers_sdpa_and_sequences_alone() -> None:
    lengths = [6, 3, 9]
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (1, sum(lengths)), generator=gen)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    bounds = (0, 6, 9, 18)
    ours, theirs = tiny_qwen3(HF_PACKED_SDPA), tiny_qwen3("sdpa")
    theirs.load_state_dict(ours.state_dict())

    logits = ours(input_ids=ids, position_ids=positions, vime_bounds=bounds, use_cache=False).logits
    # use_cache=False: with a cache transformers does not look for packed sequences.
    block_masked = theirs(input_ids=ids, position_ids=positions, use_cache=False).logits
    torch.testing.assert_close(logits, block_masked, atol=1e-5, rtol=1e-5)
    for a, b in itertools.pairwise(bounds):
        alone = ours(input_ids=ids[:, a:b]).logits
        torch.testing.assert_close(logits[:, a:b], alone, atol=1e-5, rtol=1e-5)
    # Without vime_bounds the sequence starts are read from the positions.
    from_positions = ours(input_ids=ids, position_ids=positions).logits
    torch.testing.assert_close(from_positions, logits, atol=0, rtol=0)


def test_hf_packed_sdpa_refuses_what_it_cannot_do() -> None:
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"sliding-window.*use --attn-implementation sdpa"):
        hf_packed_sdpa(torch.nn.Module(), q, q, q, None, sliding_window=4)
    with pytest.raises(ValueError, match="no padding mask"):
        hf_packed_sdpa(torch.nn.Module(), q, q, q, torch.ones(1, 1, 5, 5, dtype=torch.bool))


def test_sdpa_itself_picks_flash_on_cuda_and_the_cpu_is_left_alone(monkeypatch) -> None:
    """cuDNN builds a plan for every new sequence length (86-150 ms on an H100), and an RL
    batch's lengths are new at every step: SDPA picks flash, then the others; cuDNN comes last,
    after the math kernel that takes anything, for the long sequences sent to it directly."""
    from types import SimpleNamespace

    from torch.nn.attention import SDPBackend

    from vime.training import attention

    order = attention.CUDA_SDPA_BACKENDS
    assert order[0] == SDPBackend.FLASH_ATTENTION
    assert order.index(SDPBackend.MATH) < order.index(SDPBackend.CUDNN_ATTENTION)
    entered = []

    def record(backends, set_priority=False):
        entered.append((backends, set_priority))
        return attention.contextlib.nullcontext()

    monkeypatch.setattr(attention, "sdpa_kernel", record)
    with attention._cuda_kernels(SimpleNamespace(is_cuda=True)):
        pass
    assert entered == [(list(attention.CUDA_SDPA_BACKENDS), True)]
    q = torch.randn(1, 5, 2, 8)
    packed_causal_sdpa(q, q, q, [0, 2, 5])
    causal_sdpa(q, q, q)
    assert len(entered) == 1  # CPU tensors: torch's own choice
    monkeypatch.setattr(attention, "CUDA_SDPA_BACKENDS", None)
    with attention._cuda_kernels(SimpleNamespace(is_cuda=True)):
        pass
    assert len(entered) == 1  # None: torch's own choice on CUDA too


def test_the_benches_cudnn_order_puts_cudnn_before_the_trainers_own(monkeypatch) -> None:
    from torch.nn.attention import SDPBackend

    from vime.training import attention

    want = (
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    )
    assert attention.cudnn_first() == want
    monkeypatch.setattr(attention, "CUDA_SDPA_BACKENDS", None)  # torch's choice: all of them
    assert attention.cudnn_first() == want


@pytest.mark.parametrize("length", [1, 255, 256, 257, 700])
def test_padding_a_causal_sequence_to_a_bucket_changes_no_value_or_gradient(length) -> None:
    """What the cuDNN path relies on, with float32 SDPA standing in for cuDNN: the padded keys
    come after every real query, and the padded queries are cut off before the backward."""

    def causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    gen = torch.Generator().manual_seed(length)
    q, k, v, grad = (torch.randn(1, 3, length, 16, generator=gen) for _ in range(4))
    results = []
    for bucket in (1, 256):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = padded_causal(causal, *leaves, bucket)
        assert out.shape == q.shape
        (out * grad).sum().backward()
        results.append([out.detach(), *(t.grad for t in leaves)])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
