"""From rollout groups to a training batch: drop what cannot train, compute advantages,
and summarise the rollouts as metrics."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vime.types import Status, Trajectory

if TYPE_CHECKING:
    from vime.algorithms.config import AdvantageConfig

TRAINABLE = (Status.COMPLETED, Status.TRUNCATED)


@dataclass
class PreparedBatch:
    """The training samples of a step, their advantages, and what was left out and why.

    An episode split on chat-template drift (``--drift split``) gives one sample per
    segment, each with the episode's advantage.
    """

    trajectories: list[Trajectory] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)


def training_sample_id(trajectory: Trajectory) -> str:
    """``<task_id>/<sample_index>``, plus ``/seg<i>`` for a segment of a split episode."""
    base = f"{trajectory.task_id}/{trajectory.sample_index}"
    segment = trajectory.metadata.get("segment")
    return base if segment is None else f"{base}/seg{segment}"


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


def _trainable_samples(episode: Trajectory) -> list[Trajectory]:
    """The segments of an episode that have sampled tokens (one unless it was split)."""
    from vime.agents.trajectory import training_samples

    return [s for s in training_samples(episode) if any(s.loss_mask)]


def prepare_batch(
    groups: Sequence[Sequence[Trajectory]],
    advantage_config: AdvantageConfig,
    *,
    current_version: int = 0,
    max_staleness: int | None = None,
) -> PreparedBatch:
    """Keep trainable, fresh-enough episodes, give each its advantage, and expand each into
    its training samples.

    A failed or aborted episode cannot train (its reward means nothing); one with no
    sampled token has nothing to learn from; in async mode one staler than
    ``max_staleness`` versions is not admitted. A group keeps training only with the
    estimator's ``min_group_size`` members left; groups may differ in size. A whole-batch
    estimator sees every kept group in one call.
    """
    import torch

    from vime.algorithms.advantages import get_estimator

    estimator = get_estimator(advantage_config.advantage_estimator)
    out = PreparedBatch()

    def drop(reason: str, n: int = 1) -> None:
        out.dropped[reason] = out.dropped.get(reason, 0) + n

    kept_groups: list[list[tuple[Trajectory, list[Trajectory]]]] = []
    for group in groups:
        kept = []
        for t in group:
            samples = _trainable_samples(t) if t.status in TRAINABLE else []
            if t.status not in TRAINABLE:
                drop(f"status_{t.status}")
            elif not samples:
                drop("no_sampled_tokens")
            elif max_staleness is not None and any(
                staleness(s, current_version) > max_staleness for s in samples
            ):
                drop("stale")
            else:
                kept.append((t, samples))
        if len(kept) >= estimator.min_group_size:
            kept_groups.append(kept)
        elif kept:
            drop("group_too_small", len(kept))
    rewards = [torch.tensor([t.reward for t, _ in g], dtype=torch.float64) for g in kept_groups]
    if estimator.whole_batch and sum(r.numel() for r in rewards) == 1:
        drop("batch_too_small")  # batch statistics need two rewards
        return out
    eps = advantage_config.advantage_eps
    if estimator.whole_batch:
        advantages = estimator.fn(rewards, eps) if rewards else []
    else:
        advantages = [estimator.fn([r], eps)[0] for r in rewards]
    for group, group_adv in zip(kept_groups, advantages, strict=True):
        for (_, samples), adv in zip(group, group_adv.tolist(), strict=True):
            out.trajectories += samples
            out.advantages += [adv] * len(samples)
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
