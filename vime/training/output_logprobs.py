"""Log-probabilities and entropy of the sampled tokens straight from the last hidden states.

An RL step needs ``log p(x_t)`` of one token per position and, at most, the entropy; the
``[tokens, vocab]`` float32 logits exist only to produce those. This computes both chunk by
chunk through the output layer and recomputes each chunk's logits in backward, so peak memory
holds one chunk of logits instead of all of them (4,096 tokens x 151,936 vocab x 4 bytes is
2.5 GB, times three for the softmax and its gradient). With a vocab-parallel output layer
(Megatron tensor parallelism) pass its process group and the shard's first vocab id.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vime.training.gemm import wgrad_gemm_accum_fp32
from vime.training.kernels import output_softmax

DEFAULT_CHUNK_TOKENS = 1024


def token_logprobs_and_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    group: Any = None,
    vocab_start: int = 0,
    rows: Tensor | None = None,
    fused: bool = True,
) -> tuple[Tensor, Tensor]:
    """``log softmax(hidden @ weight.T / temperature)[t, targets[t]]`` and the entropy of that
    softmax at each position ``t``, both ``[T]`` in float32 (float64 for float64 inputs).

    ``rows`` (int64 indices into ``0 .. T-1``, increasing) limits the work to those positions,
    the ones a loss reads (an RL step scores only response tokens, not the prompt's): both
    outputs are 0.0 at every other position and get no gradient there.

    ``hidden`` is ``[T, H]`` and ``weight`` ``[V, H]`` (the local shard ``[V / tp, H]`` when
    ``group`` is a tensor-parallel group, holding ids ``vocab_start ..``), both of one dtype;
    the matmuls run in that dtype (autocast off), softmax and reductions in float32. Both
    outputs are differentiable with respect to ``hidden`` and ``weight``; an output that no
    loss uses costs no backward work.

    ``fused``: the softmax work runs in Triton kernels where they run (CUDA, or Triton's
    interpreter; vime.training.kernels.output_softmax), reading each logits chunk once forward
    and once backward; torch's ops otherwise. Same math, summed in another order.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"token_logprobs_and_entropy: hidden [T, H] and weight [V, H] expected, got "
            f"{tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if hidden.dtype != weight.dtype:
        raise ValueError(
            f"token_logprobs_and_entropy: hidden and weight need one dtype, got {hidden.dtype} "
            f"and {weight.dtype}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"token_logprobs_and_entropy: one target per row expected, got {targets.numel()}"
            f" targets for {hidden.shape[0]} rows"
        )
    if chunk_tokens < 1 or temperature <= 0:
        raise ValueError(
            f"token_logprobs_and_entropy: chunk_tokens >= 1 and temperature > 0 expected, "
            f"got {chunk_tokens} and {temperature}"
        )
    if rows is not None:
        if rows.dim() != 1 or rows.dtype != torch.long:
            raise ValueError(
                f"token_logprobs_and_entropy: rows must be a 1-D int64 index tensor, got "
                f"{rows.dtype} of shape {tuple(rows.shape)}"
            )
        # The range check reads the rows on the host: only for host tensors, so that a step on
        # the GPU never waits for the device here (the trainer builds rows from the loss mask).
        on_host = rows.device.type == "cpu"
        if on_host and rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= hidden.shape[0]):
            raise ValueError(
                f"token_logprobs_and_entropy: rows must lie in 0 .. {hidden.shape[0] - 1}, got "
                f"{int(rows.min())} .. {int(rows.max())}"
            )
        lp, ent = _ChunkedOutputLogprobs.apply(
            hidden.index_select(0, rows),
            weight,
            targets.index_select(0, rows),
            float(temperature),
            int(chunk_tokens),
            group,
            int(vocab_start),
            bool(fused),
        )
        full = hidden.new_zeros(hidden.shape[0], dtype=lp.dtype)
        return full.index_put((rows,), lp), full.index_put((rows,), ent)
    return _ChunkedOutputLogprobs.apply(
        hidden,
        weight,
        targets,
        float(temperature),
        int(chunk_tokens),
        group,
        int(vocab_start),
        bool(fused),
    )


def _all_reduce(t: Tensor, group: Any, op: str = "sum") -> Tensor:
    if group is not None:
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=group)
    return t


def _scaled_logits(h: Tensor, weight: Tensor, temperature: float) -> Tensor:
    """A chunk's logits in float32 (float64 stays float64), divided by the temperature."""
    z = h @ weight.t()
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    return z / temperature if temperature != 1.0 else z


def _chunk_stats(
    h: Tensor,
    weight: Tensor,
    targets: Tensor,
    temperature: float,
    group: Any,
    vocab_start: int,
    fused: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """A chunk's log-sum-exp over the whole vocabulary, its target's logprob and its entropy.

    One pass of ``exp`` over the chunk's logits: with ``s = z - max`` and ``e = exp(s)``,
    ``log p_y = s_y - log sum e`` and ``H = log sum e - (e . s) / sum e``.
    """
    if fused:
        z = h @ weight.t()
        return output_softmax.combine(
            *output_softmax.row_stats(z, targets, temperature, vocab_start), group
        )
    s = _scaled_logits(h, weight, temperature)
    m = _all_reduce(s.amax(dim=-1), group, "max")
    s.sub_(m[:, None])
    local = targets - vocab_start
    inside = (local >= 0) & (local < s.shape[1])
    picked = s.gather(1, local.clamp(0, s.shape[1] - 1)[:, None])[:, 0]
    target_shifted = _all_reduce(torch.where(inside, picked, torch.zeros_like(picked)), group)
    e = s.exp()
    total = _all_reduce(e.sum(dim=-1), group)
    # In e's own buffer, summed pairwise (a batched matmul would round ~5x worse in float32).
    e_dot_s = _all_reduce(e.mul_(s).sum(dim=-1), group)
    log_total = total.log()
    return m + log_total, target_shifted - log_total, log_total - e_dot_s / total


class _ChunkedOutputLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        temperature: float,
        chunk: int,
        group: Any,
        vocab_start: int,
        fused: bool,
    ) -> tuple[Tensor, Tensor]:
        fused = fused and output_softmax.available(hidden)
        with torch.autocast(hidden.device.type, enabled=False):
            return _forward(
                ctx, hidden, weight, targets, temperature, chunk, group, vocab_start, fused
            )

    @staticmethod
    def backward(ctx: Any, grad_logprobs: Tensor | None, grad_entropy: Tensor | None) -> Any:
        with torch.autocast(ctx.device_type, enabled=False):
            return _backward(ctx, grad_logprobs, grad_entropy)


def _forward(
    ctx: Any,
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    temperature: float,
    chunk: int,
    group: Any,
    vocab_start: int,
    fused: bool,
) -> tuple[Tensor, Tensor]:
    n = hidden.shape[0]
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    logprobs = torch.empty(n, dtype=dtype, device=hidden.device)
    entropy = torch.empty(n, dtype=dtype, device=hidden.device)
    lse_all = torch.empty(n, dtype=dtype, device=hidden.device)
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        lse, logprobs[a:b], entropy[a:b] = _chunk_stats(
            hidden[a:b], weight, targets[a:b], temperature, group, vocab_start, fused
        )
        lse_all[a:b] = lse
    ctx.save_for_backward(hidden, weight, targets, lse_all, entropy)
    ctx.settings = (temperature, chunk, group, vocab_start, fused)
    ctx.set_materialize_grads(False)
    ctx.device_type = hidden.device.type
    return logprobs, entropy


def _backward(ctx: Any, grad_logprobs: Tensor | None, grad_entropy: Tensor | None) -> Any:
    hidden, weight, targets, lse_all, entropy = ctx.saved_tensors
    temperature, chunk, group, vocab_start, fused = ctx.settings
    none = (None,) * 6
    if grad_logprobs is None and grad_entropy is None:
        return (None, None, *none)
    grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
    grad_weight = (
        torch.zeros(weight.shape, dtype=lse_all.dtype, device=weight.device)
        if ctx.needs_input_grad[1]
        else None
    )
    for a in range(0, hidden.shape[0], chunk):
        b = min(a + chunk, hidden.shape[0])
        h = hidden[a:b]
        if fused:
            grad_z = output_softmax.logits_grad_(
                h @ weight.t(),
                targets[a:b],
                lse_all[a:b],
                entropy[a:b],
                None if grad_logprobs is None else grad_logprobs[a:b],
                None if grad_entropy is None else grad_entropy[a:b],
                temperature,
                vocab_start,
            )
        else:
            grad_z = _logits_grad(
                h, weight, targets[a:b], lse_all[a:b], entropy[a:b],
                None if grad_logprobs is None else grad_logprobs[a:b],
                None if grad_entropy is None else grad_entropy[a:b],
                temperature, vocab_start,
            )  # fmt: skip
        if grad_hidden is not None:
            grad_hidden[a:b] = grad_z @ weight
        if grad_weight is not None:  # one GEMM adding into the fp32 buffer, no bf16 temporary
            wgrad_gemm_accum_fp32(h, grad_z, grad_weight)
    if grad_hidden is not None:
        # The hidden states feed every vocab shard: their gradient is the sum over shards.
        _all_reduce(grad_hidden, group)
    if grad_weight is not None:
        grad_weight = grad_weight.to(weight.dtype)
    return (grad_hidden, grad_weight, *none)


def _logits_grad(
    h: Tensor,
    weight: Tensor,
    targets: Tensor,
    lse: Tensor,
    entropy: Tensor,
    grad_logprobs: Tensor | None,
    grad_entropy: Tensor | None,
    temperature: float,
    vocab_start: int,
) -> Tensor:
    """A chunk's logits gradient with torch's ops, in the weight's dtype."""
    vocab = weight.shape[0]
    # d log p_y / dz = onehot(y) - p;  dH / dz = -p (log p + H). Built in place in the
    # logits' buffer: log p, then (with an entropy gradient) its factor, then p times it.
    logp = _scaled_logits(h, weight, temperature).sub_(lse[:, None])
    factor = torch.zeros(logp.shape[0], dtype=logp.dtype, device=logp.device)
    if grad_logprobs is not None:
        factor -= grad_logprobs.to(logp.dtype)
    if grad_entropy is not None:
        g = grad_entropy.to(logp.dtype)
        grad_z = logp.add(entropy[:, None]).mul_(-g[:, None]).add_(factor[:, None])
        grad_z.mul_(logp.exp_())
    else:
        grad_z = logp.exp_().mul_(factor[:, None])
    if grad_logprobs is not None:
        g = grad_logprobs.to(grad_z.dtype)
        local = targets - vocab_start
        inside = (local >= 0) & (local < vocab)
        # Rows whose target is in another vocab shard add 0; no host read of which.
        grad_z.scatter_add_(
            1, local.clamp(0, vocab - 1)[:, None], torch.where(inside, g, 0.0)[:, None]
        )
    if temperature != 1.0:
        grad_z = grad_z / temperature
    return grad_z.to(weight.dtype)
