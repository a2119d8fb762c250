"""Per-token policy and value losses on padded ``[B, T]`` tensors, and their aggregation.

Loss functions return per-token losses (to be minimised) plus boolean clip masks;
:func:`aggregate_loss` reduces them with global normalisers so that gradient accumulation
over micro-batches equals one large batch exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import get_args

import torch
from torch import Tensor

from vime.algorithms.config import AggMode, clip_range

AGG_MODES: tuple[str, ...] = get_args(AggMode)

# Bound on the log-ratios whose exp() feeds only metrics or a constant (clipped) loss: a larger
# one could overflow float32, and 0 * inf in the backward of an unselected branch is NaN.
MAX_LOG_RATIO = 20.0


def masked_log_ratio(
    logprobs: Tensor, other_logprobs: Tensor, mask: Tensor, bound: float = MAX_LOG_RATIO
) -> Tensor:
    """``logprobs - other_logprobs`` on masked tokens, 0 elsewhere (so padding holding -inf
    or garbage cannot leak NaN), clamped to ``[-bound, bound]``."""
    diff = torch.where(mask.bool(), logprobs - other_logprobs, torch.zeros_like(logprobs))
    return diff.clamp(-bound, bound)


@dataclass
class PolicyLossOutput:
    """Per-token loss ``[B, T]`` (0 outside the mask), the ratios used and where clipping acted.

    ``clipped_low``: A < 0 and ratio < 1 - eps_low; ``clipped_high``: A > 0 and
    ratio > 1 + eps_high; ``clipped_dual``: A < 0 and ratio > c. Clipped tokens get no gradient.
    """

    loss: Tensor
    ratio: Tensor
    clipped_low: Tensor
    clipped_high: Tensor
    clipped_dual: Tensor


def _check_eps(eps_low: float, eps_high: float, dual_clip: float | None) -> None:
    if not 0.0 <= eps_low < 1.0:
        raise ValueError(f"eps_low must be in [0, 1), got {eps_low}")
    if eps_high < 0.0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual clip constant c must be > 1 (Ye et al. use 3), got {dual_clip}")


def _clipped_surrogate(
    log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
) -> PolicyLossOutput:
    """``-min(r A, clip(r, 1-eps_low, 1+eps_high) A)`` with ``r = exp(log_ratio)``, and dual
    clip for A < 0.

    Written with explicit conditions rather than ``max``/``clamp`` so that a clipped token's
    loss is a constant (gradient exactly zero) and the thresholds themselves are unclipped.
    Where the loss depends on the ratio (A != 0 and not clipped) the ratio is exact: for
    A < 0 without dual clip PPO's loss grows without bound as ``r`` does, and so does its
    gradient (in float32 ``r`` overflows past a log-ratio of 88, which needs a token that
    the old policy gave a probability below e^-88). Elsewhere the ratio, which then only
    feeds metrics, comes from the log-ratio clamped to +-MAX_LOG_RATIO.
    """
    active = mask.bool()
    pos = (advantages > 0) & active
    neg = (advantages < 0) & active
    with torch.no_grad():
        exact = torch.exp(log_ratio)  # inf compares correctly; it never reaches a gradient
    clipped_high = pos & (exact > 1.0 + eps_high)
    clipped_low = neg & (exact < 1.0 - eps_low)
    clipped_dual = neg & (exact > (math.inf if dual_clip is None else dual_clip))
    free = (pos | neg) & ~(clipped_high | clipped_low | clipped_dual)
    bounded = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    ratio = torch.where(free, torch.exp(torch.where(free, log_ratio, 0.0)), bounded)
    loss = -advantages * ratio
    loss = torch.where(clipped_high, -advantages * (1.0 + eps_high), loss)
    loss = torch.where(clipped_low, -advantages * (1.0 - eps_low), loss)
    if dual_clip is not None:
        loss = torch.where(clipped_dual, -advantages * dual_clip, loss)
    loss = torch.where(active, loss, torch.zeros_like(loss))
    return PolicyLossOutput(loss, ratio, clipped_low, clipped_high, clipped_dual)


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float | None = None,
    eps_high: float | None = None,
    dual_clip: float | None = None,
) -> PolicyLossOutput:
    """PPO clipped surrogate per token (Schulman et al. 2017, arXiv:1707.06347).

    ``r_t = exp(logp_t - old_logp_t)``;
    ``loss_t = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)``.
    ``eps_high > eps_low`` is DAPO's clip-higher (Yu et al. 2025, arXiv:2503.14476; they use
    0.2 / 0.28). Unset ranges follow :func:`~vime.algorithms.config.clip_range` (0.2 / 0.2;
    ``eps_high`` defaults to ``eps_low``). Dual clip (Ye et al. 2020, "Mastering
    Complex Control in MOBA Games", arXiv:1912.09729) bounds the loss for negative
    advantages: ``loss_t = min(loss_t, -c A_t)`` when ``A_t < 0``, i.e. a constant once
    ``r_t > c``. Without it the loss of a token with ``A_t < 0`` is ``-A_t r_t`` for every
    ratio, however large (computed exactly, not clamped).
    """
    eps_low, eps_high = clip_range("ppo", eps_low, eps_high)
    _check_eps(eps_low, eps_high, dual_clip)
    log_ratio = masked_log_ratio(logprobs, old_logprobs, mask, math.inf)
    return _clipped_surrogate(log_ratio, advantages, mask, eps_low, eps_high, dual_clip)


def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float | None = None,
    eps_high: float | None = None,
    dual_clip: float | None = None,
) -> PolicyLossOutput:
    """GSPO: sequence-level clipped importance ratio (Zheng et al. 2025, arXiv:2507.18071).

    ``s_i = exp(mean_t (logp_{i,t} - old_logp_{i,t}))`` over the masked tokens of sequence i
    (the length-normalised ratio), and the clipped surrogate of :func:`ppo_clip_loss` is
    applied with ``s_i`` in place of the token ratio. Implemented as the paper's GSPO-token
    form, ``s_{i,t} = sg[s_i] * exp(logp_{i,t} - sg[logp_{i,t}])``, whose value is ``s_i`` on
    every token: with ``seq-mean-token-mean`` aggregation (GSPO's own, the default of
    ``--policy-loss gspo``) and one advantage per sequence the gradient equals GSPO's exactly,
    and per-token advantages are allowed. Unset ranges follow
    :func:`~vime.algorithms.config.clip_range`: the paper's 3e-4 / 4e-4, or a symmetric clip
    when only ``eps_low`` is given.
    """
    eps_low, eps_high = clip_range("gspo", eps_low, eps_high)
    _check_eps(eps_low, eps_high, dual_clip)
    m = mask.to(logprobs.dtype)
    lengths = m.sum(dim=1).clamp(min=1.0)
    seq_log_ratio = masked_log_ratio(logprobs, old_logprobs, mask, math.inf).sum(dim=1) / lengths
    token_log_ratio = seq_log_ratio.detach()[:, None] + (logprobs - logprobs.detach())
    log_ratio = torch.where(mask.bool(), token_log_ratio, torch.zeros_like(logprobs))
    return _clipped_surrogate(log_ratio, advantages, mask, eps_low, eps_high, dual_clip)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
) -> tuple[Tensor, Tensor]:
    """Per-token PPO critic loss; returns ``(loss [B, T], clipped [B, T] bool)``.

    ``0.5 * max((V - R)^2, (old_V + clip(V - old_V, -c, c) - R)^2)`` (the clipped value
    objective of PPO2 / OpenAI baselines); with ``clip=None`` plain ``0.5 * (V - R)^2``.
    ``clipped`` marks tokens where the clipped term is the larger one (no gradient flows).
    """
    active = mask.bool()
    unclipped = (values - returns) ** 2
    if clip is None:
        loss, clipped = 0.5 * unclipped, torch.zeros_like(active)
    else:
        if clip <= 0:
            raise ValueError(f"value clip must be > 0 or None, got {clip}")
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        clipped_sq = (v_clipped - returns) ** 2
        clipped = (clipped_sq > unclipped) & active
        loss = 0.5 * torch.maximum(unclipped, clipped_sq)
    return torch.where(active, loss, torch.zeros_like(loss)), clipped


def count_loss_units(mask: Tensor) -> tuple[int, int]:
    """``(num_tokens, num_seqs)`` of a mask: masked tokens, and rows with at least one.

    Sum these over every micro-batch (and data-parallel rank) of a step to get the global
    normalisers for :func:`aggregate_loss`.
    """
    lengths = mask.sum(dim=-1)
    return int(lengths.sum()), int((lengths > 0).sum())


def aggregate_loss(
    per_token: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar.

    - ``token-mean``: ``sum_{i,t} m l / N_tok`` (DAPO's token-level loss).
    - ``seq-mean-token-sum``: ``sum_i (sum_t m l) / N_seq`` (Dr.GRPO: no length normalisation).
    - ``seq-mean-token-mean``: ``sum_i (sum_t m l / |y_i|) / N_seq`` (original GRPO).

    ``N_tok``/``N_seq`` default to this batch's counts (:func:`count_loss_units`: rows with
    no masked token do not count). Pass the totals over all micro-batches of an optimiser
    step and sum the micro-batch losses (no division by the number of micro-batches): the
    gradient is then exactly that of one big batch. Under data parallelism with gradient
    averaging over ``W`` ranks, pass the global totals divided by ``W``.
    """
    if per_token.shape != mask.shape or per_token.dim() != 2:
        raise ValueError(
            f"aggregate_loss: per_token {tuple(per_token.shape)} and mask "
            f"{tuple(mask.shape)} must both be [B, T]"
        )
    m = mask.to(per_token.dtype)
    masked = per_token * m
    if mode == "token-mean":
        # count_loss_units reads back to the host: only when no normaliser is given.
        denom = count_loss_units(mask)[0] if num_tokens is None else num_tokens
        return masked.sum() / max(denom, 1)
    if mode == "seq-mean-token-sum":
        seq = masked.sum(dim=1)
    elif mode == "seq-mean-token-mean":
        seq = masked.sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
    else:
        raise ValueError(f"aggregate_loss: unknown mode {mode!r}; choose one of {AGG_MODES}")
    denom = count_loss_units(mask)[1] if num_seqs is None else num_seqs
    return seq.sum() / max(denom, 1)
