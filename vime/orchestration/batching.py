"""From rollout groups to a training batch: drop what cannot train, compute advantages,
and summarise the rollouts as metrics."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from vime.types import Status, Trajectory

TRAINABLE = (Status.COMPLETED, Status.TRUNCATED)
GLOBAL_ESTIMATORS = ("reinforce_plus_plus",)


@dataclass
class PreparedBatch:
    """Trajectories that will train, their advantages, and what was left out and why."""

    trajectories: list[Trajectory] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)


def staleness(trajectory: Trajectory, current_version: int) -> int:
    """How many weight versions behind ``current_version`` its oldest sampled token is."""
    versions = [
        v
        for v, m in zip(trajectory.token_versions, trajectory.loss_mask, strict=False)
        if m and v >= 0
    ]
    if not versions:
        versions = [v for v in trajectory.weight_versions if v is not None and v >= 0]
    return current_version - min(versions) if versions else 0


def prepare_batch(
    groups: Sequence[Sequence[Trajectory]],
    advantage_config: object,
    *,
    current_version: int = 0,
    max_staleness: int | None = None,
) -> PreparedBatch:
    """Keep trainable, fresh-enough trajectories and give each its advantage.

    A failed or aborted episode cannot train (its reward means nothing); a trajectory with no
    sampled token has nothing to learn from; in async mode one staler than ``max_staleness``
    versions is not admitted. Group estimators need two members left in a group.
    """
    import torch

    from vime.algorithms.advantages import compute_advantages

    out = PreparedBatch()

    def drop(reason: str, n: int = 1) -> None:
        out.dropped[reason] = out.dropped.get(reason, 0) + n

    kept_groups: list[list[Trajectory]] = []
    for group in groups:
        kept = []
        for t in group:
            if t.status not in TRAINABLE:
                drop(f"status_{t.status}")
            elif not any(t.loss_mask):
                drop("no_sampled_tokens")
            elif max_staleness is not None and staleness(t, current_version) > max_staleness:
                drop("stale")
            else:
                kept.append(t)
        if len(kept) >= 2 or (kept and advantage_config.advantage_estimator in GLOBAL_ESTIMATORS):
            kept_groups.append(kept)
        elif kept:
            drop("group_too_small", len(kept))
    if not kept_groups:
        return out
    name = advantage_config.advantage_estimator
    if name in GLOBAL_ESTIMATORS:
        flat = [t for g in kept_groups for t in g]
        adv = compute_advantages(
            torch.tensor([[t.reward for t in flat]], dtype=torch.float64), advantage_config
        )
        out.trajectories, out.advantages = flat, adv[0].tolist()
        return out
    for group in kept_groups:
        rewards = torch.tensor([[t.reward for t in group]], dtype=torch.float64)
        adv = compute_advantages(rewards, advantage_config)[0].tolist()
        out.trajectories += group
        out.advantages += adv
    return out


def _stats(values: list[float], prefix: str) -> dict[str, float]:
    if not values:
        return {}
    return {
        f"{prefix}_mean": statistics.fmean(values),
        f"{prefix}_std": statistics.pstdev(values) if len(values) > 1 else 0.0,
        f"{prefix}_max": max(values),
        f"{prefix}_min": min(values),
    }


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Reward, length, tool-error, drift and status metrics of a step's episodes."""
    metrics: dict[str, float] = {}
    finished = [t for t in trajectories if t.status in TRAINABLE]
    metrics.update(
        {f"rollout/{k}": v for k, v in _stats([t.reward for t in finished], "reward").items()}
    )
    lengths = [float(t.num_response_tokens) for t in finished]
    metrics.update({f"rollout/{k}": v for k, v in _stats(lengths, "response_len").items()})
    turns = sum(t.metrics.get("num_turns", 1.0) for t in trajectories)
    tool_calls = sum(t.metrics.get("tool_calls", 0.0) for t in trajectories)
    tool_errors = sum(t.metrics.get("tool_errors", 0.0) for t in trajectories)
    metrics["rollout/tool_error_rate"] = tool_errors / tool_calls if tool_calls else 0.0
    metrics["rollout/turns_per_episode"] = turns / max(len(trajectories), 1)
    metrics["rollout/drift_count"] = sum(t.metrics.get("drift_count", 0.0) for t in trajectories)
    for status in Status:
        metrics[f"rollout/status_{status}"] = float(sum(t.status is status for t in trajectories))
    metrics["rollout/episodes"] = float(len(trajectories))
    metrics["rollout/truncated_rate"] = (
        sum(t.status is Status.TRUNCATED for t in trajectories) / len(trajectories)
        if trajectories
        else 0.0
    )
    if "correct" in (finished[0].metrics if finished else {}):
        metrics["rollout/accuracy"] = statistics.fmean(
            t.metrics.get("correct", 0.0) for t in finished
        )
    return {k: v for k, v in metrics.items() if not (isinstance(v, float) and math.isnan(v))}
