"""The policy loss a trainer backend calls: surrogate + off-policy correction + KL + entropy."""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec

import torch
from torch import Tensor

from vime.algorithms.config import LossConfig
from vime.algorithms.kl import kl_estimate
from vime.algorithms.losses import aggregate_loss, count_loss_units, gspo_loss, ppo_clip_loss
from vime.algorithms.offpolicy import (
    mismatch_metric_tensors,
    sequence_keep_mask,
    tensor_metrics_to_floats,
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


def _masked_mean(values: Tensor, mask: Tensor, count: Tensor) -> Tensor:
    # 0 for an empty mask; where() keeps a masked-out inf/nan out of the mean.
    zero = torch.zeros((), dtype=torch.float64, device=mask.device)
    return torch.where(mask > 0, values.double() * mask, zero).sum() / count.clamp(min=1)


def policy_loss_tensors(
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
) -> tuple[Tensor, dict[str, Tensor]]:
    """Scalar loss to minimise, and metrics, for one (micro-)batch of ``[B, T]`` tensors.

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

    Each metric is a float64 0-d tensor on the inputs' device, and nothing here reads a value
    back to the host: a trainer folds the micro-batches' metrics on the device and reads them
    once per step, so the GPU never waits for the CPU inside a step.
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
    if num_tokens is None or num_seqs is None:  # host counts only when no normaliser is given
        local_tokens, local_seqs = count_loss_units(mask)
        num_tokens = local_tokens if num_tokens is None else num_tokens
        num_seqs = local_seqs if num_seqs is None else num_seqs
    loss_mask = mask.to(logprobs.dtype)
    metrics: dict[str, Tensor] = {}

    if rollout_logprobs is not None:
        metrics.update(mismatch_metric_tensors(old, rollout_logprobs, mask))
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
            seqs = (mask.sum(dim=-1) > 0).sum().clamp(min=1).double()
            metrics["policy/seq_masked_frac"] = (~keep).sum().double() / seqs
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
        count = active.sum()
        denom = count.clamp(min=1).double()
        lm = loss_mask.double()
        log_ratio = torch.log(out.ratio.double())
        lowest = torch.full((), -torch.inf, dtype=out.ratio.dtype, device=out.ratio.device)
        ratio_max = torch.where(active, out.ratio, lowest).amax() if active.numel() else lowest
        metrics.update(
            {
                "policy/loss": loss.detach().double(),
                "policy/pg_loss": _masked_mean(per_token, lm, count),
                "policy/clipfrac_low": out.clipped_low.sum().double() / denom,
                "policy/clipfrac_high": out.clipped_high.sum().double() / denom,
                "policy/clipfrac_dual": out.clipped_dual.sum().double() / denom,
                "policy/approx_kl": _masked_mean(torch.expm1(log_ratio) - log_ratio, lm, count),
                "policy/ratio_mean": _masked_mean(out.ratio, lm, count),
                "policy/ratio_max": torch.where(count > 0, ratio_max.double(), 0.0),
                "policy/num_tokens": count.double(),
            }
        )
        if kl is not None:
            metrics["policy/kl_loss"] = _masked_mean(kl, lm, count)
        if entropy is not None:
            metrics["policy/entropy"] = _masked_mean(entropy, lm, count)
        if config.tis_cap is not None:
            metrics["policy/tis_weight_mean"] = _masked_mean(weights, lm, count)
            capped = (weights >= config.tis_cap) & active
            metrics["policy/tis_clipfrac"] = capped.sum().double() / denom
    return loss, metrics


_P = ParamSpec("_P")


def _with_float_metrics(
    tensors_fn: Callable[_P, tuple[Tensor, dict[str, Tensor]]],
) -> Callable[_P, tuple[Tensor, dict[str, float]]]:
    def policy_loss(*args: _P.args, **kwargs: _P.kwargs) -> tuple[Tensor, dict[str, float]]:
        """Scalar loss to minimise, and float metrics, for one (micro-)batch of ``[B, T]``
        tensors: :func:`policy_loss_tensors` (the same arguments) with its metrics read back to
        the host in one copy."""
        loss, metrics = tensors_fn(*args, **kwargs)
        return loss, tensor_metrics_to_floats(metrics)

    policy_loss.__qualname__ = policy_loss.__name__
    return policy_loss


policy_loss = _with_float_metrics(policy_loss_tensors)
