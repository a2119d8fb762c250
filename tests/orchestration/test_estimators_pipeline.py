"""Every `--advantage-estimator` through the path `vime train` runs: flags -> AdvantageConfig ->
`prepare_batch`, on groups of different sizes, against references written from the papers.

The references below are plain Python, one formula per paper, not calls into vime.
"""

from __future__ import annotations

import math

import pytest

from vime.algorithms.advantages import ESTIMATORS
from vime.cli.main import parse_args
from vime.cli.train_cmd import build_setup
from vime.errors import ConfigError
from vime.orchestration.batching import prepare_batch
from vime.types import Status, Trajectory

EPS = 1e-6


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: list[float]) -> float:  # unbiased (Bessel), as the papers' implementations use
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _grpo(groups):  # Shao et al. 2024: z-score within the group
    return [[(r - _mean(g)) / (_std(g) + EPS) for r in g] for g in groups]


def _dr_grpo(groups):  # Liu et al. 2025: the group mean as baseline, no std
    return [[r - _mean(g) for r in g] for g in groups]


def _rloo(groups):  # Kool et al. 2019 / Ahmadian et al. 2024: leave-one-out mean
    return [[r - (sum(g) - r) / (len(g) - 1) for r in g] for g in groups]


def _reinforce_pp(groups):  # Hu 2025: no baseline, normalised over the whole batch
    flat = [r for g in groups for r in g]
    m, s = _mean(flat), _std(flat)
    return [[(r - m) / (s + EPS) for r in g] for g in groups]


def _reinforce_pp_baseline(groups):  # Hu 2025: group mean, then whole-batch normalisation
    centred = [[r - _mean(g) for r in g] for g in groups]
    flat = [a for g in centred for a in g]
    m, s = _mean(flat), _std(flat)
    return [[(a - m) / (s + EPS) for a in g] for g in centred]


REFERENCES = {
    "grpo": _grpo,
    "dr_grpo": _dr_grpo,
    "rloo": _rloo,
    "reinforce_plus_plus": _reinforce_pp,
    "reinforce_plus_plus_baseline": _reinforce_pp_baseline,
}


def traj(reward: float, status: Status = Status.COMPLETED) -> Trajectory:
    return Trajectory(
        token_ids=[5, 6, 7],
        loss_mask=[0, 1, 1],
        logprobs=[0.0, -0.1, -0.2],
        prompt_length=1,
        reward=reward,
        status=status,
    )


def advantage_config(name: str):
    argv = ["train", "--model", "m", "--env", "vime/Math-v0", "--advantage-estimator", name]
    return build_setup(parse_args(argv)).advantage


def test_every_registered_estimator_has_a_paper_reference_here() -> None:
    assert set(ESTIMATORS) == set(REFERENCES)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_prepare_batch_gives_the_papers_numbers_on_uneven_groups(name: str) -> None:
    # Two groups of 4 sampled; one episode of the first failed, so they are 3 and 4 long.
    rewards = [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
    groups = [
        [traj(1.0), traj(0.0), traj(0.0), traj(1.0, Status.FAILED)],
        [traj(r) for r in rewards[1]],
    ]
    out = prepare_batch(groups, advantage_config(name))
    expected = [a for g in REFERENCES[name](rewards) for a in g]
    assert out.advantages == pytest.approx(expected, abs=1e-9)
    assert [t.reward for t in out.trajectories] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]


def test_reinforce_plus_plus_baseline_normalises_over_the_whole_batch_not_per_group() -> None:
    # Group-centred rewards [2/3, -1/3, -1/3] and [1/2, 1/2, -1/2, -1/2] have mean 0 and
    # unbiased std sqrt((4/9 + 1/9 + 1/9 + 4 * 1/4) / 6) = sqrt(5/18) over the batch.
    # One group at a time would give GRPO's 1.1547 / -0.5774 for the first group.
    groups = [[traj(1.0), traj(0.0), traj(0.0)], [traj(1.0), traj(1.0), traj(0.0), traj(0.0)]]
    out = prepare_batch(groups, advantage_config("reinforce_plus_plus_baseline"))
    s = math.sqrt(5 / 18)
    assert out.advantages[:3] == pytest.approx([2 / 3 / s, -1 / 3 / s, -1 / 3 / s], abs=1e-5)
    assert out.advantages[:3] == pytest.approx([1.2649, -0.6325, -0.6325], abs=1e-4)
    assert out.advantages[3:] == pytest.approx([0.5 / s] * 2 + [-0.5 / s] * 2, abs=1e-5)


def test_group_estimators_drop_a_group_left_with_one_member_but_reinforce_pp_keeps_it() -> None:
    groups = [[traj(1.0), traj(0.0, Status.FAILED)], [traj(1.0), traj(0.0)]]
    grpo = prepare_batch(groups, advantage_config("grpo"))
    assert len(grpo.trajectories) == 2 and grpo.dropped["group_too_small"] == 1
    rpp = prepare_batch(groups, advantage_config("reinforce_plus_plus"))
    assert [t.reward for t in rpp.trajectories] == [1.0, 1.0, 0.0]
    assert rpp.advantages == pytest.approx(
        [a for g in _reinforce_pp([[1.0], [1.0, 0.0]]) for a in g]
    )


def test_a_whole_batch_estimator_with_one_reward_drops_it_instead_of_failing() -> None:
    out = prepare_batch([[traj(1.0)]], advantage_config("reinforce_plus_plus"))
    assert out.trajectories == [] and out.dropped == {"batch_too_small": 1}


def test_an_unregistered_estimator_is_refused_with_the_registered_names() -> None:
    from vime.algorithms.config import AdvantageConfig

    with pytest.raises(
        ConfigError, match="'ppo_gae' is not registered; choose one of grpo, dr_grpo"
    ):
        AdvantageConfig(advantage_estimator="ppo_gae")
