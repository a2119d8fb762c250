"""Inputs and references for the output-layer logprob tests (importable by spawned ranks)."""

from __future__ import annotations

import torch

from vime.training.output_logprobs import token_logprobs_and_entropy


def inputs(n=37, h=16, v=53, seed=0, dtype=torch.float32):
    """Random hidden states, output weights, targets and loss coefficients (same per seed)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64).mul(0.5)
    targets = torch.randint(0, v, (n,), generator=g)
    coef_lp = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    coef_ent = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    return (
        hidden.to(dtype).requires_grad_(),
        weight.to(dtype).requires_grad_(),
        targets,
        coef_lp,
        coef_ent,
    )


def reference(hidden, weight, targets, temperature=1.0):
    """The plain path: full logits, log-softmax, gather; entropy from the softmax."""
    logits = (hidden @ weight.t()) / temperature
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(1, targets[:, None])[:, 0], entropy


def grads(fn, hidden, weight, targets, coef_lp, coef_ent, use_entropy=True):
    """Outputs of ``fn`` and the gradients of a loss mixing both, w.r.t. hidden and weight."""
    lp, ent = fn(hidden, weight, targets)
    loss = (lp * coef_lp).sum() + ((ent * coef_ent).sum() if use_entropy else 0.0)
    gh, gw = torch.autograd.grad(loss, (hidden, weight))
    return lp.detach(), ent.detach(), gh, gw


def vocab_parallel_grads(
    vocab: int, chunk: int, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, ...]:
    """On each rank of the default group: logprobs, entropy and gradients through this
    rank's vocab shard of the output layer (float64 unless ``dtype``)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    hidden, weight, targets, coef_lp, coef_ent = inputs(v=vocab, seed=4, dtype=dtype)
    shard = vocab // world
    local = weight.detach()[rank * shard : (rank + 1) * shard].clone().requires_grad_()
    lp, ent = token_logprobs_and_entropy(
        hidden, local, targets, chunk_tokens=chunk, group=dist.group.WORLD, vocab_start=rank * shard
    )
    loss = (lp * coef_lp).sum() + (ent * coef_ent).sum()
    gh, gw = torch.autograd.grad(loss, (hidden, local))
    return lp.detach(), ent.detach(), gh, gw
