"""The policy loss a trainer backend calls: surrogate + off-policy correction + KL + entropy."""

from __future__ import annotations

import torch
from torch import Tensor

from vime.algorithms.config import LossConfig
from vime.algorithms.kl import kl_estimate
from vime.algorithms.losses import aggregate_loss, count_loss_units, gspo_loss, ppo_clip_loss
from vime.algorithms.offpolicy import (
    mismatch_metrics,
    sequence_keep_mask,
    truncated_importance_weights,
)


def _check_shapes(mask: Tensor, **tensors: Tensor | None) -> None:
    if mask.dim() != 2:
        raise ValueError(f"policy_loss: mask must be [B, T], got shape {tuple(mask.shape)}")
    for name, t in tensors.items():
        if t is not None and t.shape != mask.shape:
            raise ValueError(
                f"policy_loss: {name} has shape {tuple(t.shape)} but mask has "
                f"{tuple(mask.shape)}; pass every per-token tensor padded to the same [B, T] "
                "(broadcast sequence advantages with broadcast_to_tokens)"
            )


def _masked_mean(values: Tensor, mask: Tensor, count: int) -> float:
    return float((values.double() * mask).sum() / count) if count else 0.0


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    config: LossConfig,
    *,
    rollout_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar loss to minimise, and float metrics, for one (micro-)batch of ``[B, T]`` tensors.

    ``loss = agg( w_t * L^clip_t + kl_loss_coef * KL_t - entropy_coef * H_t )`` over the loss
    mask, where ``L^clip`` is :func:`~vime.algorithms.losses.ppo_clip_loss` or
    :func:`~vime.algorithms.losses.gspo_loss` against ``old_logprobs`` (``None``: on-policy,
    the detached ``logprobs``), ``w_t`` the TIS weights against ``rollout_logprobs`` when
    ``config.tis_cap`` is set, ``KL_t`` the ``config.kl_loss_type`` estimate against
    ``ref_logprobs`` and ``H_t`` the per-token ``entropy``. Sequences rejected by the
    sequence-level mismatch bounds contribute zero. ``num_tokens``/``num_seqs`` are the
    global normalisers of :func:`~vime.algorithms.losses.aggregate_loss` (default: this
    batch's, counted before any sequence is rejected).

    Metrics (local to this call, means over its masked tokens): ``policy/loss``,
    ``policy/pg_loss``, ``policy/clipfrac_low|high|dual``, ``policy/approx_kl`` (k3 of
    KL(old || current)), ``policy/ratio_mean|max``, ``policy/num_tokens``; with the matching
    inputs also ``policy/kl_loss``, ``policy/entropy``, ``policy/tis_weight_mean``,
    ``policy/tis_clipfrac``, ``policy/seq_masked_frac`` and ``mismatch/*`` from
    :func:`~vime.algorithms.offpolicy.mismatch_metrics`.
    """
    _check_shapes(
        mask,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        rollout_logprobs=rollout_logprobs,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
    )
    needs_rollout = config.tis_cap is not None or config.uses_sequence_mask
    if needs_rollout and rollout_logprobs is None:
        raise ValueError(
            "policy_loss: config sets --tis-cap or a --seq-mask-* bound but no "
            "rollout_logprobs were given; pass the engine's logprobs or unset those options"
        )
    if config.kl_loss_coef > 0 and ref_logprobs is None:
        raise ValueError(
            f"policy_loss: --kl-loss-coef={config.kl_loss_coef} needs ref_logprobs from the "
            "reference model; compute them or set --kl-loss-coef 0"
        )
    if config.entropy_coef > 0 and entropy is None:
        raise ValueError(
            f"policy_loss: --entropy-coef={config.entropy_coef} needs the per-token entropy "
            "(entropy_from_logits); compute it or set --entropy-coef 0"
        )
    # bf16 logprobs would make exp(ratio) and the clip thresholds coarse: work in >= float32.
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    logprobs = logprobs.to(dtype)
    old_logprobs, advantages, rollout_logprobs, ref_logprobs, entropy = (
        None if t is None else t.to(dtype)
        for t in (old_logprobs, advantages, rollout_logprobs, ref_logprobs, entropy)
    )
    old = logprobs.detach() if old_logprobs is None else old_logprobs.detach()
    local_tokens, local_seqs = count_loss_units(mask)
    num_tokens = local_tokens if num_tokens is None else num_tokens
    num_seqs = local_seqs if num_seqs is None else num_seqs
    loss_mask = mask.to(logprobs.dtype)
    metrics: dict[str, float] = {}

    if rollout_logprobs is not None:
        metrics.update(mismatch_metrics(old, rollout_logprobs, mask))
        if config.uses_sequence_mask:
            keep = sequence_keep_mask(
                old,
                rollout_logprobs,
                mask,
                geo_low=config.seq_mask_geo_low,
                geo_high=config.seq_mask_geo_high,
                token_low=config.seq_mask_token_low,
                token_high=config.seq_mask_token_high,
            )
            metrics["policy/seq_masked_frac"] = float((~keep).sum()) / max(local_seqs, 1)
            loss_mask = loss_mask * keep[:, None].to(loss_mask.dtype)

    surrogate = gspo_loss if config.policy_loss == "gspo" else ppo_clip_loss
    out = surrogate(
        logprobs,
        old,
        advantages,
        loss_mask,
        eps_low=config.clip_low,
        eps_high=config.clip_high,
        dual_clip=config.eps_clip_c,
    )
    per_token = out.loss
    if config.tis_cap is not None:
        weights = truncated_importance_weights(old, rollout_logprobs, loss_mask, cap=config.tis_cap)
        per_token = per_token * weights
    total = per_token
    kl = None
    if ref_logprobs is not None:
        kl = kl_estimate(logprobs, ref_logprobs, loss_mask, config.kl_loss_type)
        if config.kl_loss_coef > 0:
            total = total + config.kl_loss_coef * kl
    if entropy is not None and config.entropy_coef > 0:
        total = total - config.entropy_coef * entropy * loss_mask
    loss = aggregate_loss(
        total, loss_mask, config.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs
    )

    with torch.no_grad():
        active = loss_mask.bool()
        count = int(active.sum())
        lm = loss_mask.double()
        log_ratio = torch.log(out.ratio.double())
        metrics.update(
            {
                "policy/loss": float(loss),
                "policy/pg_loss": _masked_mean(per_token, lm, count),
                "policy/clipfrac_low": float(out.clipped_low.sum()) / max(count, 1),
                "policy/clipfrac_high": float(out.clipped_high.sum()) / max(count, 1),
                "policy/clipfrac_dual": float(out.clipped_dual.sum()) / max(count, 1),
                "policy/approx_kl": _masked_mean(torch.expm1(log_ratio) - log_ratio, lm, count),
                "policy/ratio_mean": _masked_mean(out.ratio, lm, count),
                "policy/ratio_max": float(out.ratio[active].max()) if count else 0.0,
                "policy/num_tokens": float(count),
            }
        )
        if kl is not None:
            metrics["policy/kl_loss"] = _masked_mean(kl, lm, count)
        if entropy is not None:
            metrics["policy/entropy"] = _masked_mean(entropy, lm, count)
        if config.tis_cap is not None:
            metrics["policy/tis_weight_mean"] = _masked_mean(weights, lm, count)
            capped = (weights >= config.tis_cap) & active
            metrics["policy/tis_clipfrac"] = float(capped.sum()) / max(count, 1)
    return loss, metrics
