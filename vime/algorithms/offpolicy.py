"""Off-policy correction for the gap between the rollout engine's and the trainer's logprobs.

The engine (vLLM) and the trainer compute slightly different probabilities for the same
tokens (kernels, precision, stale weights under async training). These functions reweight
or drop tokens and sequences by the ratio ``pi_trainer / pi_rollout`` and measure the gap.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vime.algorithms.kl import MAX_KL_LOG_RATIO
from vime.algorithms.losses import masked_log_ratio


def _log_ratio(trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> Tensor:
    return masked_log_ratio(
        trainer_logprobs.detach(), rollout_logprobs.detach(), mask, MAX_KL_LOG_RATIO
    )


def truncated_importance_weights(
    trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, cap: float = 2.0
) -> Tensor:
    """Truncated importance sampling per token, TIS (Yao et al. 2025, "Your Efficient RL
    Framework Secretly Brings You Off-Policy RL Training", fengyao.notion.site/off-policy-rl;
    truncated IS after Ionides 2008).

    ``w_t = min(exp(logp_trainer_t - logp_rollout_t), C)``, detached (a constant weight on
    the policy loss of token t); 0 outside the mask. ``trainer_logprobs`` are the trainer's
    logprobs of the policy that sampled (the PPO "old" logprobs).
    """
    if cap <= 0:
        raise ValueError(f"truncated_importance_weights: cap must be > 0, got {cap}")
    weights = torch.exp(_log_ratio(trainer_logprobs, rollout_logprobs, mask)).clamp(max=cap)
    return weights * mask.to(weights.dtype)


def sequence_keep_mask(
    trainer_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    *,
    geo_low: float | None = None,
    geo_high: float | None = None,
    token_low: float | None = None,
    token_high: float | None = None,
) -> Tensor:
    """Sequence-level masking by the trainer/rollout ratio; returns ``[B]`` bool, True = keep.

    A sequence is dropped when its geometric-mean ratio ``exp(mean_t log(pi_trainer /
    pi_rollout))`` lies outside ``[geo_low, geo_high]``, or when any token's ratio lies
    outside ``[token_low, token_high]`` (a veto on single catastrophic tokens). This is the
    sequence-level rejection of masked importance sampling (Liu et al. 2025, "When Speed
    Kills Stability", and GSPO's length-normalised ratio); ``None`` disables a bound. Bounds
    are inclusive. Rows with no masked token are kept (they carry no loss).
    """
    log_ratio = _log_ratio(trainer_logprobs, rollout_logprobs, mask)
    active = mask.bool()
    lengths = mask.sum(dim=1).to(log_ratio.dtype)
    geo = torch.exp(log_ratio.sum(dim=1) / lengths.clamp(min=1.0))
    keep = torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device)
    if geo_low is not None:
        keep &= geo >= geo_low
    if geo_high is not None:
        keep &= geo <= geo_high
    ratio = torch.exp(log_ratio)
    if token_low is not None:
        keep &= ~((ratio < token_low) & active).any(dim=1)
    if token_high is not None:
        keep &= ~((ratio > token_high) & active).any(dim=1)
    return keep | (lengths == 0)


def mismatch_metrics(
    trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor
) -> dict[str, float]:
    """Rollout-vs-trainer logprob mismatch over the masked tokens.

    ``mismatch/abs_diff_mean`` and ``mismatch/abs_diff_max`` of ``|logp_trainer -
    logp_rollout|``; ``mismatch/kl_k3``, the mean k3 estimate of KL(pi_rollout || pi_trainer)
    (tokens were sampled by the rollout policy, so ``r - 1 - log r`` with ``r = pi_trainer /
    pi_rollout`` is unbiased); ``mismatch/kl_k1``, the mean of ``log(pi_rollout /
    pi_trainer)``. The KL terms clamp the log-ratio to +-20; the abs diffs do not.
    All 0.0 when the mask is empty.
    """
    return tensor_metrics_to_floats(
        mismatch_metric_tensors(trainer_logprobs, rollout_logprobs, mask)
    )


def mismatch_metric_tensors(
    trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor
) -> dict[str, Tensor]:
    """:func:`mismatch_metrics` as float64 0-d tensors on the inputs' device, computed without
    reading anything back to the host (a trainer reads all its metrics once per step)."""
    active = mask.bool()
    count = active.sum()
    denom = count.clamp(min=1).double()
    zero = torch.zeros((), dtype=torch.float64, device=mask.device)
    abs_diff = (trainer_logprobs.detach() - rollout_logprobs.detach()).double().abs()
    log_r = _log_ratio(trainer_logprobs, rollout_logprobs, mask).double()
    # where(), not multiplication by the mask: an inf outside the mask must not become nan.
    return {
        "mismatch/abs_diff_mean": torch.where(active, abs_diff, zero).sum() / denom,
        "mismatch/abs_diff_max": torch.where(active, abs_diff, zero).amax()
        if abs_diff.numel()
        else zero,
        "mismatch/kl_k3": torch.where(active, torch.expm1(log_r) - log_r, zero).sum() / denom,
        "mismatch/kl_k1": torch.where(active, -log_r, zero).sum() / denom,
    }


def tensor_metrics_to_floats(metrics: dict[str, Tensor]) -> dict[str, float]:
    """Python floats of 0-d metric tensors, read back in one device-to-host copy."""
    if not metrics:
        return {}
    values = torch.stack([v.detach().double().reshape(()) for v in metrics.values()]).tolist()
    return dict(zip(metrics, values, strict=True))
