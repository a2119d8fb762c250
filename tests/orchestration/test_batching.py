"""From rollout groups to a training batch: what trains, with which advantage, what is dropped."""

from __future__ import annotations

import pytest

from vime.algorithms.config import AdvantageConfig
from vime.orchestration.batching import prepare_batch, rollout_metrics, staleness
from vime.types import Status, Trajectory


def traj(
    reward: float, status: Status = Status.COMPLETED, versions=(0, 0), sampled: bool = True
) -> Trajectory:
    mask = [0, 1, 1] if sampled else [0, 0, 0]
    return Trajectory(
        token_ids=[5, 6, 7],
        loss_mask=mask,
        logprobs=[0.0, -0.1, -0.2] if sampled else [0.0] * 3,
        prompt_length=1,
        reward=reward,
        status=status,
        token_versions=[-1, *versions],
        metrics={"tool_calls": 2.0, "tool_errors": 1.0, "correct": reward},
    )


GRPO = AdvantageConfig()


def test_grpo_advantages_are_computed_within_each_group() -> None:
    out = prepare_batch([[traj(1.0), traj(0.0)], [traj(1.0), traj(1.0)]], GRPO)
    assert len(out.trajectories) == 4
    assert out.advantages[0] == pytest.approx(-out.advantages[1])
    assert out.advantages[0] > 0
    assert out.advantages[2:] == [0.0, 0.0]


def test_failed_and_aborted_episodes_never_train_and_are_counted() -> None:
    groups = [[traj(1.0), traj(0.0), traj(1.0, Status.FAILED), traj(0.0, Status.ABORTED)]]
    out = prepare_batch(groups, GRPO)
    assert [t.status for t in out.trajectories] == [Status.COMPLETED, Status.COMPLETED]
    assert out.dropped == {"status_failed": 1, "status_aborted": 1}


def test_a_group_left_with_one_member_is_dropped_for_group_estimators() -> None:
    out = prepare_batch([[traj(1.0), traj(0.0, Status.FAILED)]], GRPO)
    assert out.trajectories == []
    assert out.dropped == {"status_failed": 1, "group_too_small": 1}


def test_trajectories_without_sampled_tokens_are_dropped() -> None:
    out = prepare_batch([[traj(1.0), traj(0.0), traj(1.0, sampled=False)]], GRPO)
    assert len(out.trajectories) == 2 and out.dropped == {"no_sampled_tokens": 1}


def test_staleness_counts_versions_behind_the_oldest_sampled_token() -> None:
    assert staleness(traj(1.0, versions=(3, 5)), current_version=6) == 3
    assert staleness(traj(1.0, versions=(6, 6)), current_version=6) == 0


def test_async_mode_refuses_trajectories_staler_than_the_bound() -> None:
    group = [traj(1.0, versions=(1, 2)), traj(0.0, versions=(3, 3)), traj(1.0, versions=(3, 3))]
    out = prepare_batch([group], GRPO, current_version=3, max_staleness=1)
    assert len(out.trajectories) == 2 and out.dropped == {"stale": 1}


def test_reinforce_plus_plus_normalises_over_the_whole_batch() -> None:
    cfg = AdvantageConfig(advantage_estimator="reinforce_plus_plus")
    out = prepare_batch([[traj(1.0)], [traj(0.0)]], cfg)
    assert len(out.trajectories) == 2
    assert out.advantages[0] == pytest.approx(-out.advantages[1])


def test_rollout_metrics_report_reward_tool_errors_and_status() -> None:
    m = rollout_metrics([traj(1.0), traj(0.0), traj(0.0, Status.FAILED)])
    assert m["rollout/reward_mean"] == 0.5
    assert m["rollout/tool_error_rate"] == 0.5
    assert m["rollout/status_failed"] == 1.0
    assert m["rollout/accuracy"] == 0.5
    assert m["rollout/response_len_mean"] == 2.0
