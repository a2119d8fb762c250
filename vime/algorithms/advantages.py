"""Advantage estimators: group baselines (GRPO, Dr.GRPO, RLOO), REINFORCE++ and GAE.

Outcome estimators take rewards grouped per prompt: a ``[num_groups, group_size]`` tensor,
or a list of 1-D tensors when groups differ in size (members dropped after a failure), and
return advantages of the same shape. :data:`ESTIMATORS` registers each one that
``--advantage-estimator`` can select. Token-level functions (GAE, discounted returns,
whitening) take padded ``[B, T]`` tensors with a loss mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from vime.algorithms.config import AdvantageConfig

# A [G, N] tensor (equal groups) or one 1-D tensor per group (ragged groups).
Groups = Tensor | Sequence[Tensor]


def _as_groups(
    rewards: Groups, min_size: int, name: str
) -> tuple[list[Tensor], Callable[[list[Tensor]], Groups]]:
    """The groups of ``rewards`` as 1-D tensors, and how to return results in its shape."""
    if isinstance(rewards, Tensor):
        if rewards.dim() != 2:
            raise ValueError(
                f"{name}: rewards must be grouped as [num_groups, group_size], got shape "
                f"{tuple(rewards.shape)}; reshape with rewards.view(num_groups, group_size), "
                "or pass a list of 1-D group tensors"
            )
        groups = list(rewards.unbind(0))

        def pack(out: list[Tensor]) -> Groups:
            return torch.stack(out) if out else rewards.clone()

    else:
        groups = [torch.as_tensor(g) for g in rewards]
        for i, g in enumerate(groups):
            if g.dim() != 1:
                raise ValueError(
                    f"{name}: group {i} must be a 1-D tensor of rewards, got shape {tuple(g.shape)}"
                )

        def pack(out: list[Tensor]) -> Groups:
            return out

    for i, g in enumerate(groups):
        if g.numel() < min_size:
            raise ValueError(
                f"{name}: needs at least {min_size} samples per group, got group_size="
                f"{g.numel()} (group {i}); sample more responses per prompt or use "
                "reinforce_plus_plus_advantages, which needs no group"
            )
    return groups, pack


def _centre(rewards: Tensor, baseline: Tensor) -> Tensor:
    """``rewards - baseline`` of one group, exactly 0 when its rewards are all equal (a float
    mean of equal values can be off by one ulp, which the std division would blow up)."""
    if bool((rewards == rewards[0]).all()):
        return torch.zeros_like(rewards)
    return rewards - baseline


def _batch_normalise(groups: list[Tensor], eps: float, name: str) -> list[Tensor]:
    """``(x - mean(x)) / (std(x) + eps)`` with the statistics of all groups together."""
    flat = torch.cat(groups) if groups else torch.zeros(0)
    if flat.numel() < 2:
        raise ValueError(
            f"{name}: needs at least 2 rewards in the batch to normalise, got {flat.numel()}"
        )
    if bool((flat == flat[0]).all()):  # nothing to tell apart (and no 0/0 with eps=0)
        return [torch.zeros_like(g) for g in groups]
    normalised = (flat - flat.mean()) / (flat.std() + eps)
    return list(normalised.split([g.numel() for g in groups]))


def grpo_advantages(rewards: Groups, *, normalize_std: bool = True, eps: float = 1e-6) -> Groups:
    """GRPO advantages (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    ``A_i = (r_i - mean(r)) / (std(r) + eps)`` within each group, where std is the unbiased
    sample standard deviation (Bessel's correction, as in the common implementations).
    A group whose rewards are all equal gets exactly zero advantages. With
    ``normalize_std=False`` this is the Dr.GRPO advantage (Liu et al. 2025, "Understanding
    R1-Zero-Like Training", arXiv:2503.20783): ``A_i = r_i - mean(r)``.
    """
    groups, pack = _as_groups(rewards, 2, "grpo_advantages")
    out = []
    for g in groups:
        centred = _centre(g, g.mean())
        out.append(centred / (g.std() + eps) if normalize_std else centred)
    return pack(out)


def dr_grpo_advantages(rewards: Groups) -> Groups:
    """Dr.GRPO advantages (Liu et al. 2025, arXiv:2503.20783): ``A_i = r_i - mean(r)``.

    Dr.GRPO also drops the per-response length normalisation of the loss: pair it with the
    ``seq-mean-token-sum`` aggregation (the paper's constant divisor only rescales the
    learning rate).
    """
    return grpo_advantages(rewards, normalize_std=False)


def rloo_advantages(rewards: Groups) -> Groups:
    """RLOO advantages (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740).

    Each sample's baseline is the mean reward of the *other* samples of its group:
    ``A_i = r_i - (sum_j r_j - r_i) / (n - 1) = n / (n - 1) * (r_i - mean(r))``, with ``n``
    the size of that group.
    """
    groups, pack = _as_groups(rewards, 2, "rloo_advantages")
    return pack([_centre(g, (g.sum() - g) / (g.numel() - 1)) for g in groups])


def reinforce_plus_plus_advantages(rewards: Groups, *, eps: float = 1e-6) -> Groups:
    """REINFORCE++ advantages for outcome rewards (Hu 2025, arXiv:2501.03262).

    No per-prompt baseline; the whole batch is normalised at once:
    ``A_i = (r_i - mean_batch(r)) / (std_batch(r) + eps)`` (unbiased std). A tensor of any
    shape or a list of groups is accepted; statistics run over all rewards. For per-token
    rewards (KL penalty in the reward) use :func:`discounted_returns` then :func:`whiten`.
    """
    name = "reinforce_plus_plus_advantages"
    if isinstance(rewards, Tensor):
        return _batch_normalise([rewards.reshape(-1)], eps, name)[0].view_as(rewards)
    groups, pack = _as_groups(rewards, 1, name)
    return pack(_batch_normalise(groups, eps, name))


def reinforce_plus_plus_baseline_advantages(rewards: Groups, *, eps: float = 1e-6) -> Groups:
    """REINFORCE++-baseline advantages (Hu 2025, arXiv:2501.03262, group-baseline variant).

    Subtract each group's mean, then normalise by the statistics of the *whole batch* of
    centred rewards: ``a_i = r_i - mean_group(r)``,
    ``A_i = (a_i - mean_batch(a)) / (std_batch(a) + eps)`` (unbiased std over every sample
    of every group). Calling it one group at a time gives GRPO's per-group z-scores instead.
    """
    name = "reinforce_plus_plus_baseline_advantages"
    groups, pack = _as_groups(rewards, 2, name)
    centred = [_centre(g, g.mean()) for g in groups]
    return pack(_batch_normalise(centred, eps, name))


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


@dataclass(frozen=True)
class Estimator:
    """An outcome advantage estimator that ``--advantage-estimator NAME`` selects.

    ``fn(groups, eps)`` maps one 1-D reward tensor per group (sizes may differ) to advantages
    of the same shapes. ``whole_batch``: the result of a group depends on the other groups
    (batch statistics), so every group of a step must be passed in one call.
    ``min_group_size``: members a group needs after failed episodes are dropped.
    """

    name: str
    fn: Callable[[list[Tensor], float], list[Tensor]]
    whole_batch: bool
    min_group_size: int


# The one registry of estimators: a new estimator is a function above and a line here.
# (name, fn(groups, eps), whole_batch, min_group_size)
ESTIMATORS: dict[str, Estimator] = {
    name: Estimator(name, fn, whole_batch, min_size)
    for name, fn, whole_batch, min_size in (
        ("grpo", lambda g, eps: grpo_advantages(g, eps=eps), False, 2),
        ("dr_grpo", lambda g, eps: dr_grpo_advantages(g), False, 2),
        ("rloo", lambda g, eps: rloo_advantages(g), False, 2),
        ("reinforce_plus_plus", lambda g, e: reinforce_plus_plus_advantages(g, eps=e), True, 1),
        (
            "reinforce_plus_plus_baseline",
            lambda g, e: reinforce_plus_plus_baseline_advantages(g, eps=e),
            True,
            2,
        ),
    )
}


def get_estimator(name: str) -> Estimator:
    """The registered estimator ``name``; a ``ValueError`` lists the registered names."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; registered: {', '.join(ESTIMATORS)}"
        ) from None


def compute_advantages(rewards: Groups, config: AdvantageConfig) -> Groups:
    """Advantages of grouped outcome rewards (a ``[G, N]`` tensor or a list of 1-D group
    tensors, returned in the same form) with the estimator ``config.advantage_estimator``
    names; every group is passed at once, as whole-batch estimators need."""
    estimator = get_estimator(config.advantage_estimator)
    if isinstance(rewards, Tensor):
        if rewards.dim() != 2:
            raise ValueError(
                f"compute_advantages: rewards must be [num_groups, group_size] or a list of "
                f"groups, got shape {tuple(rewards.shape)}"
            )
        return torch.stack(estimator.fn(list(rewards.unbind(0)), config.advantage_eps))
    return estimator.fn([torch.as_tensor(g) for g in rewards], config.advantage_eps)
