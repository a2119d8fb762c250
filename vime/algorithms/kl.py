"""Regularisers: KL to a reference policy (k1/k2/k3), entropy from logits, overlong shaping."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")

# k3 contains exp(-log_ratio): bound the log-ratio so one bad token cannot overflow the loss.
MAX_KL_LOG_RATIO = 20.0


def kl_estimate(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, estimator: str = "k3"
) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman 2020,
    "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html).

    With ``x = log pi(y_t) - log pi_ref(y_t)``: ``k1 = x`` (unbiased, high variance, can be
    negative); ``k2 = x^2 / 2`` (biased, low variance; its gradient is the true KL's);
    ``k3 = exp(-x) - 1 + x`` (unbiased and always >= 0; GRPO's KL term). ``x`` is clamped to
    +-20. Returns ``[B, T]``, 0 outside the mask.
    """
    x = ((logprobs - ref_logprobs) * mask).clamp(-MAX_KL_LOG_RATIO, MAX_KL_LOG_RATIO)
    if estimator == "k1":
        kl = x
    elif estimator == "k2":
        kl = 0.5 * x**2
    elif estimator == "k3":
        kl = torch.expm1(-x) + x
    else:
        raise ValueError(
            f"kl_estimate: unknown estimator {estimator!r}; use one of {KL_ESTIMATORS}"
        )
    return kl * mask.to(kl.dtype)


def kl_penalized_rewards(
    token_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    *,
    coef: float,
    estimator: str = "k1",
) -> Tensor:
    """KL as a reward penalty (Ziegler et al. 2019, arXiv:1909.08593; used by PPO-RLHF and
    REINFORCE++): ``r'_t = r_t - coef * KL_t`` with the KL detached, 0 outside the mask.
    Feed the result to :func:`~vime.algorithms.advantages.gae_advantages` or
    :func:`~vime.algorithms.advantages.discounted_returns`."""
    kl = kl_estimate(logprobs.detach(), ref_logprobs.detach(), mask, estimator)
    return (token_rewards - coef * kl) * mask.to(token_rewards.dtype)


def _entropy_rows(logits: Tensor) -> Tensor:
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    return log_z - (probs * logits).sum(dim=-1)


def entropy_from_logits(logits: Tensor, *, chunk_size: int | None = 1024) -> Tensor:
    """Entropy of the next-token distribution, ``H = logsumexp(z) - sum_v softmax(z)_v z_v``,
    for logits ``[..., V]``; returns ``[...]`` in float32.

    Memory-aware: rows are processed ``chunk_size`` at a time, and under autograd each chunk
    is recomputed in backward (activation checkpointing), so the peak extra memory is one
    chunk's ``[chunk_size, V]`` softmax instead of the whole batch's. ``None``: one chunk.
    The entropy bonus itself (Mnih et al. 2016, arXiv:1602.01783) is ``-coef * H`` in the loss.
    """
    shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    if chunk_size is None or flat.shape[0] <= chunk_size:
        return _entropy_rows(flat).reshape(shape)
    from torch.utils.checkpoint import checkpoint

    grad = torch.is_grad_enabled() and flat.requires_grad
    parts = []
    for chunk in flat.split(chunk_size):
        if grad:
            parts.append(checkpoint(_entropy_rows, chunk, use_reentrant=False))
        else:
            parts.append(_entropy_rows(chunk))
    return torch.cat(parts).reshape(shape)


def overlong_penalty(
    lengths: Tensor, *, max_length: int, buffer_length: int, penalty_factor: float = 1.0
) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), a reward
    term to add to the task reward of each response.

    With ``L = max_length`` and ``B = buffer_length``: 0 if ``|y| <= L - B``;
    ``((L - B) - |y|) / B`` (linear from 0 to -1) if ``L - B < |y| <= L``; -1 if ``|y| > L``;
    all scaled by ``penalty_factor``.
    """
    if not 0 < buffer_length <= max_length:
        raise ValueError(
            f"overlong_penalty: need 0 < buffer_length <= max_length, got "
            f"buffer_length={buffer_length}, max_length={max_length}"
        )
    lengths = lengths.to(torch.float64 if lengths.dtype == torch.float64 else torch.float32)
    start = max_length - buffer_length
    linear = (start - lengths) / buffer_length
    penalty = torch.where(lengths <= start, torch.zeros_like(lengths), linear)
    penalty = torch.where(lengths > max_length, torch.full_like(lengths, -1.0), penalty)
    return penalty_factor * penalty
