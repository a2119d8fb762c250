"""The foreach multi-tensor kernels compute what megatron-core's slots promise, and
``install`` puts them where megatron-core's optimizer and clipping look them up."""

from __future__ import annotations

import pytest
import torch

from vime.training.megatron import multi_tensor


def tensors(seed: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(7, 3), (11,), (2, 5, 4), (1,)]
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes]


def test_l2_norm_is_the_norm_of_all_elements() -> None:
    ts = tensors(0)
    want = torch.cat([t.double().flatten() for t in ts]).norm()
    got, per_tensor = multi_tensor.foreach_l2_norm(0, None, [ts], False)
    assert got.shape == (1,) and got.dtype == torch.float32 and per_tensor is None
    torch.testing.assert_close(got.double(), want.reshape(1), rtol=1e-6, atol=0)


def test_scale_in_place_copy_and_scaled_copy() -> None:
    grads = tensors(1)
    before = [g.clone() for g in grads]
    multi_tensor.foreach_scale(0, None, [grads, grads], 0.25)
    for g, b in zip(grads, before, strict=True):
        torch.testing.assert_close(g, b * 0.25, rtol=0, atol=0)

    src, dst = tensors(2), [torch.empty(t.shape, dtype=torch.bfloat16) for t in tensors(2)]
    multi_tensor.foreach_scale(0, None, [src, dst], 1.0)
    for d, s in zip(dst, src, strict=True):
        assert torch.equal(d, s.to(torch.bfloat16))

    dst32 = [torch.zeros_like(t) for t in src]
    multi_tensor.foreach_scale(0, None, [src, dst32], -3.0)
    for d, s in zip(dst32, src, strict=True):
        torch.testing.assert_close(d, s * -3.0, rtol=0, atol=0)
    assert src[0].abs().sum() > 0  # the sources were not touched by the scaled copy
    torch.testing.assert_close(src[0], tensors(2)[0], rtol=0, atol=0)


def test_scale_refuses_mismatched_lists() -> None:
    with pytest.raises(ValueError, match="2 sources for 1 destinations"):
        multi_tensor.foreach_scale(0, None, [tensors(3)[:2], tensors(3)[:1]], 1.0)


def test_install_replaces_only_the_local_fallbacks() -> None:
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    saved = (
        clip_grads.l2_norm_impl,
        clip_grads.multi_tensor_scale_impl,
        optimizer.multi_tensor_scale_impl,
    )
    try:
        clip_grads.l2_norm_impl = utils.local_multi_tensor_l2_norm
        clip_grads.multi_tensor_scale_impl = utils.local_multi_tensor_scale
        sentinel = object()
        optimizer.multi_tensor_scale_impl = sentinel  # as if Apex had been found
        multi_tensor.install()
        multi_tensor.install()
        assert clip_grads.l2_norm_impl is multi_tensor.foreach_l2_norm
        assert clip_grads.multi_tensor_scale_impl is multi_tensor.foreach_scale
        assert optimizer.multi_tensor_scale_impl is sentinel
    finally:
        (
            clip_grads.l2_norm_impl,
            clip_grads.multi_tensor_scale_impl,
            optimizer.multi_tensor_scale_impl,
        ) = saved
