"""Advantage estimators: group baselines (GRPO, Dr.GRPO, RLOO), REINFORCE++ and GAE.

Sequence-level estimators take rewards grouped as ``[num_groups, group_size]`` (the samples
of one prompt in one row); token-level ones take padded ``[B, T]`` tensors with a loss mask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from vime.algorithms.config import AdvantageConfig


def _check_groups(rewards: Tensor, min_size: int, name: str) -> None:
    if rewards.dim() != 2:
        raise ValueError(
            f"{name}: rewards must be grouped as [num_groups, group_size], got shape "
            f"{tuple(rewards.shape)}; reshape with rewards.view(num_groups, group_size)"
        )
    if rewards.shape[1] < min_size:
        raise ValueError(
            f"{name}: needs at least {min_size} samples per group, got group_size="
            f"{rewards.shape[1]}; sample more responses per prompt or use "
            f"reinforce_plus_plus_advantages, which needs no group"
        )


def _centre(rewards: Tensor, baseline: Tensor) -> Tensor:
    """``rewards - baseline``, exactly 0 in groups whose rewards are all equal (a float mean
    of equal values can be off by one ulp, which the std division would blow up)."""
    constant = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(rewards), rewards - baseline)


def grpo_advantages(rewards: Tensor, *, normalize_std: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO advantages (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    ``A_i = (r_i - mean(r)) / (std(r) + eps)`` within each group (one row), where std is the
    unbiased sample standard deviation (Bessel's correction, as in the common implementations).
    A group whose rewards are all equal gets exactly zero advantages. With
    ``normalize_std=False`` this is the Dr.GRPO advantage (Liu et al. 2025, "Understanding
    R1-Zero-Like Training", arXiv:2503.20783): ``A_i = r_i - mean(r)``.
    """
    _check_groups(rewards, 2, "grpo_advantages")
    centred = _centre(rewards, rewards.mean(dim=1, keepdim=True))
    if not normalize_std:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True) + eps)


def dr_grpo_advantages(rewards: Tensor) -> Tensor:
    """Dr.GRPO advantages (Liu et al. 2025, arXiv:2503.20783): ``A_i = r_i - mean(r)``.

    Dr.GRPO also drops the per-response length normalisation of the loss: pair it with the
    ``seq-mean-token-sum`` aggregation (the paper's constant divisor only rescales the
    learning rate).
    """
    return grpo_advantages(rewards, normalize_std=False)


def rloo_advantages(rewards: Tensor) -> Tensor:
    """RLOO advantages (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740).

    Each sample's baseline is the mean reward of the *other* samples of its group:
    ``A_i = r_i - (sum_j r_j - r_i) / (n - 1) = n / (n - 1) * (r_i - mean(r))``.
    """
    _check_groups(rewards, 2, "rloo_advantages")
    n = rewards.shape[1]
    others_mean = (rewards.sum(dim=1, keepdim=True) - rewards) / (n - 1)
    return _centre(rewards, others_mean)


def reinforce_plus_plus_advantages(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++ advantages for outcome rewards (Hu 2025, arXiv:2501.03262).

    No per-prompt baseline; the whole batch is normalised at once:
    ``A_i = (r_i - mean_batch(r)) / (std_batch(r) + eps)``. Any shape is accepted; statistics
    run over all elements. For per-token rewards (KL penalty in the reward) use
    :func:`discounted_returns` then :func:`whiten`.
    """
    if rewards.numel() < 2:
        raise ValueError(
            f"reinforce_plus_plus_advantages: needs at least 2 rewards in the batch to "
            f"normalise, got {rewards.numel()}"
        )
    return (rewards - rewards.mean()) / (rewards.std() + eps)


def reinforce_plus_plus_baseline_advantages(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++-baseline advantages (Hu 2025, arXiv:2501.03262, group-baseline variant).

    Subtract the group mean, then normalise by the statistics of the whole batch:
    ``a_i = r_i - mean_group(r)``, ``A_i = (a_i - mean_batch(a)) / (std_batch(a) + eps)``.
    """
    _check_groups(rewards, 2, "reinforce_plus_plus_baseline_advantages")
    centred = _centre(rewards, rewards.mean(dim=1, keepdim=True))
    return (centred - centred.mean()) / (centred.std() + eps)


def whiten(values: Tensor, mask: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Normalise ``values`` to zero mean and unit variance over the masked positions.

    ``(x - mean_m(x)) / (std_m(x) + eps)`` with the unbiased masked std; positions outside
    the mask become 0. This is REINFORCE++'s global batch normalisation for token advantages.
    """
    m = mask.to(values.dtype)
    count = m.sum()
    if count < 2:
        raise ValueError(f"whiten: needs at least 2 masked positions, got {int(count)}")
    mean = (values * m).sum() / count
    var = (((values - mean) * m) ** 2).sum() / (count - 1)
    return (values - mean) / (var.sqrt() + eps) * m


def discounted_returns(token_rewards: Tensor, mask: Tensor, *, gamma: float = 1.0) -> Tensor:
    """Reward-to-go over the masked tokens of each row: ``G_t = r_t + gamma * G_next``.

    ``G_next`` is the return at the next *masked* position (env/tool tokens with mask 0 are
    skipped, and their rewards ignored); outside the mask the result is 0.
    """
    m = mask.to(token_rewards.dtype)
    out = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        step = token_rewards[:, t] + gamma * running
        running = torch.where(m[:, t] > 0, step, running)
        out[:, t] = running * m[:, t]
    return out


def gae_advantages(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation for PPO with a critic (Schulman et al. 2016,
    arXiv:1506.02438). Returns ``(advantages, returns)``, both ``[B, T]``.

    Over the masked tokens of a row, taken in order as time steps:
    ``delta_t = r_t + gamma * V_next - V_t``, ``A_t = delta_t + gamma * lam * A_next``,
    ``returns_t = A_t + V_t``, where ``next`` is the next masked position and both are 0
    after the last one (the episode ends there). Env/tool tokens (mask 0) are skipped, so a
    multi-turn trajectory is one episode; put rewards on masked positions (the last one for
    an outcome reward). Outside the mask both outputs are 0.
    """
    if token_rewards.shape != values.shape or values.shape != mask.shape:
        raise ValueError(
            f"gae_advantages: token_rewards {tuple(token_rewards.shape)}, values "
            f"{tuple(values.shape)} and mask {tuple(mask.shape)} must have one [B, T] shape"
        )
    m = mask.to(values.dtype)
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    for t in range(values.shape[1] - 1, -1, -1):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        active = m[:, t] > 0
        next_adv = torch.where(active, adv, next_adv)
        next_value = torch.where(active, values[:, t], next_value)
        advantages[:, t] = adv * m[:, t]
    returns = (advantages + values) * m
    return advantages, returns


def broadcast_to_tokens(seq_values: Tensor, mask: Tensor) -> Tensor:
    """Per-sequence values ``[B]`` (or ``[G, N]``, flattened row-major) to ``[B, T]`` tokens,
    0 outside the loss mask."""
    flat = seq_values.reshape(-1)
    if flat.shape[0] != mask.shape[0]:
        raise ValueError(
            f"broadcast_to_tokens: {flat.shape[0]} sequence values for a mask of "
            f"{mask.shape[0]} rows; flatten groups in the same order as the batch rows"
        )
    return flat[:, None] * mask.to(flat.dtype)


def compute_advantages(rewards: Tensor, config: AdvantageConfig) -> Tensor:
    """Advantages ``[num_groups, group_size]`` of grouped outcome rewards with the estimator
    that ``config.advantage_estimator`` names (see the functions above for the formulas)."""
    name, eps = config.advantage_estimator, config.advantage_eps
    if name == "grpo":
        return grpo_advantages(rewards, eps=eps)
    if name == "dr_grpo":
        return dr_grpo_advantages(rewards)
    if name == "rloo":
        return rloo_advantages(rewards)
    if name == "reinforce_plus_plus":
        return reinforce_plus_plus_advantages(rewards, eps=eps)
    if name == "reinforce_plus_plus_baseline":
        return reinforce_plus_plus_baseline_advantages(rewards, eps=eps)
    raise ValueError(f"compute_advantages: unknown estimator {name!r}")
