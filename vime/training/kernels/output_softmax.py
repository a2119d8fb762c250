"""The chunked output layer's softmax work in Triton: per row of a logits chunk, forward reads
the logits once (online max, sum of exponentials, target logit, entropy term) and backward reads
them once and writes the logits' gradient in their own buffer.

torch's version of the same math (vime.training.output_logprobs) makes a float32 copy of the
chunk and about ten passes over it (max, subtract, gather, exp, sum, multiply, sum, and in
backward subtract, add, multiply, exp, scatter, cast): at 151,936 vocab entries per token, that
traffic costs more than the output layer's GEMMs on an H200.

Per row, with ``z`` the logits divided by the temperature and ``m`` a running maximum, the
forward returns ``m``, ``S = sum exp(z - m)``, ``T = sum exp(z - m) (z - m)`` and the target's
``z`` (0 where the target is in another vocab shard), from which ``log-sum-exp = m + log S``,
``log p(target) = z_t - m - log S`` and ``entropy = log S - T / S``; shards combine theirs
exactly (:func:`combine`). Moving ``m`` to ``m'`` rescales ``S`` by ``exp(m - m')`` and ``T``
to ``exp(m - m') (T + (m - m') S)``.

The gradient of ``a * log p(target) + b * entropy`` with respect to the logits is
``(a * onehot(target) - p * (a + b * (log p + entropy))) / temperature``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vime.training.kernels import runs_here

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - torch wheels for CUDA ship Triton
    triton = None

BLOCK = 4096  # vocab entries per iteration of a row's loop
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def available(logits: Tensor) -> bool:
    """Whether the kernels can take this logits chunk (CUDA or the interpreter; 16/32-bit)."""
    return triton is not None and logits.dtype in _DTYPES and runs_here(logits)


def row_stats(
    logits: Tensor, targets: Tensor, temperature: float, vocab_start: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per row of ``logits`` ``[C, V]`` (this shard's vocab, ids ``vocab_start ..``): the
    running max ``m``, ``S``, ``T`` and the target's scaled logit (0 outside the shard), all
    float32 ``[C]``. See the module docstring."""
    _check(logits, targets)
    rows, vocab = logits.shape
    stats = torch.empty(4, rows, dtype=torch.float32, device=logits.device)
    _forward_kernel[(rows,)](
        logits, logits.stride(0), targets, stats, rows, vocab, vocab_start, 1.0 / temperature,
        BLOCK=BLOCK, num_warps=8,
    )  # fmt: skip
    return stats[0], stats[1], stats[2], stats[3]


def combine(
    m: Tensor, s: Tensor, t: Tensor, z_target: Tensor, group: Any = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Log-sum-exp, target logprob and entropy per row from :func:`row_stats`; over the vocab
    shards of ``group`` when given (one max and one sum all-reduce)."""
    if group is not None:
        import torch.distributed as dist

        top = m.clone()
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        shift = m - top
        scale = shift.exp()
        sums = torch.stack([s * scale, scale * (t + shift * s), z_target])
        dist.all_reduce(sums, group=group)
        m, (s, t, z_target) = top, sums
    log_s = s.log()
    lse = m + log_s
    return lse, z_target - lse, log_s - t / s


def logits_grad_(
    logits: Tensor,
    targets: Tensor,
    lse: Tensor,
    entropy: Tensor,
    grad_logprobs: Tensor | None,
    grad_entropy: Tensor | None,
    temperature: float,
    vocab_start: int,
) -> Tensor:
    """Overwrite ``logits`` ``[C, V]`` with the gradient of ``sum(grad_logprobs * log p(target)
    + grad_entropy * entropy)`` with respect to them (None: that output had no gradient), in
    their dtype; returns ``logits``."""
    _check(logits, targets)
    rows, vocab = logits.shape
    zeros = torch.zeros(rows, dtype=torch.float32, device=logits.device)
    g_lp = zeros if grad_logprobs is None else grad_logprobs.float().contiguous()
    g_ent = zeros if grad_entropy is None else grad_entropy.float().contiguous()
    _backward_kernel[(rows,)](
        logits, logits.stride(0), targets, lse.float().contiguous(), entropy.float().contiguous(),
        g_lp, g_ent, vocab, vocab_start, 1.0 / temperature, BLOCK=BLOCK, num_warps=8,
    )  # fmt: skip
    return logits


def _check(logits: Tensor, targets: Tensor) -> None:
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"output softmax: logits [C, V] with unit vocab stride expected, got "
                         f"shape {tuple(logits.shape)} strides {logits.stride()}")  # fmt: skip
    if targets.shape != logits.shape[:1] or targets.dtype != torch.long:
        raise ValueError(f"output softmax: one int64 target per row expected, got "
                         f"{targets.dtype} {tuple(targets.shape)}")  # fmt: skip
    if not available(logits):
        raise ValueError(f"output softmax: no Triton kernel for {logits.dtype} on {logits.device}")


if triton is not None:

    @triton.jit
    def _forward_tile(base, start, vocab, inv_temp, m, s, t, BLOCK: tl.constexpr,
                      MASKED: tl.constexpr):  # fmt: skip
        cols = start + tl.arange(0, BLOCK)
        if MASKED:
            inside = cols < vocab
            z = tl.load(base + cols, mask=inside, other=0.0).to(tl.float32) * inv_temp
            m_new = tl.maximum(m, tl.max(tl.where(inside, z, -3.0e38), axis=0))
        else:
            z = tl.load(base + cols).to(tl.float32) * inv_temp
            m_new = tl.maximum(m, tl.max(z, axis=0))
        scale = tl.exp(m - m_new)
        d = z - m_new
        e = tl.exp(d)
        if MASKED:
            e = tl.where(inside, e, 0.0)
        t = scale * (t + (m - m_new) * s) + tl.sum(e * d, axis=0)
        s = scale * s + tl.sum(e, axis=0)
        return m_new, s, t

    @triton.jit
    def _forward_kernel(
        logits, row_stride, targets, stats, rows, vocab, vocab_start, inv_temp,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        base = logits + row.to(tl.int64) * row_stride
        m = tl.full((), -3.0e38, tl.float32)  # finite: (m - m_new) * 0 must stay 0
        s = tl.zeros((), tl.float32)
        t = tl.zeros((), tl.float32)
        # Whole tiles unmasked (a mask of unknown length stops vector loads), then the tail.
        full = (vocab // BLOCK) * BLOCK
        for start in range(0, full, BLOCK):
            m, s, t = _forward_tile(base, start, vocab, inv_temp, m, s, t, BLOCK, False)
        if full < vocab:
            m, s, t = _forward_tile(base, full, vocab, inv_temp, m, s, t, BLOCK, True)
        local = tl.load(targets + row) - vocab_start
        ok = (local >= 0) & (local < vocab)
        z_t = tl.load(base + tl.where(ok, local, 0)).to(tl.float32) * inv_temp
        tl.store(stats + row, m)
        tl.store(stats + rows + row, s)
        tl.store(stats + 2 * rows + row, t)
        tl.store(stats + 3 * rows + row, tl.where(ok, z_t, 0.0))

    @triton.jit
    def _backward_tile(base, start, vocab, local, inv_temp, lse_row, a, b, h,
                       BLOCK: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
        cols = start + tl.arange(0, BLOCK)
        if MASKED:
            inside = cols < vocab
            z = tl.load(base + cols, mask=inside, other=0.0)
        else:
            inside = None
            z = tl.load(base + cols)
        logp = z.to(tl.float32) * inv_temp - lse_row
        grad = -tl.exp(logp) * (a + b * (logp + h))
        grad = tl.where(cols == local, grad + a, grad) * inv_temp
        tl.store(base + cols, grad.to(z.dtype), mask=inside)

    @triton.jit
    def _backward_kernel(
        logits, row_stride, targets, lse, entropy, g_lp, g_ent, vocab, vocab_start, inv_temp,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        base = logits + row.to(tl.int64) * row_stride
        a = tl.load(g_lp + row)
        b = tl.load(g_ent + row)
        h = tl.load(entropy + row)
        lse_row = tl.load(lse + row)
        local = tl.load(targets + row) - vocab_start
        full = (vocab // BLOCK) * BLOCK
        for start in range(0, full, BLOCK):
            _backward_tile(base, start, vocab, local, inv_temp, lse_row, a, b, h, BLOCK, False)
        if full < vocab:
            _backward_tile(base, full, vocab, local, inv_temp, lse_row, a, b, h, BLOCK, True)
