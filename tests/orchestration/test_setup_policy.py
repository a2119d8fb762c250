"""Run policy lives in the configs, not in the CLI: Python callers of run_training() build a
TrainSetup themselves and must get the same defaults as `vime train`."""

from __future__ import annotations

from vime.agents.config import AgentConfig
from vime.algorithms.config import AdvantageConfig, LossConfig
from vime.inference.config import ServeConfig
from vime.inference.sampling import SamplingConfig
from vime.orchestration.config import RunConfig
from vime.orchestration.setup import TrainSetup
from vime.rollout.config import RolloutConfig
from vime.training.base import TrainerConfig


def python_setup(mode: str, loss: LossConfig | None = None) -> TrainSetup:
    """A setup built the way a Python caller of run_training() builds it (no CLI)."""
    return TrainSetup(
        run=RunConfig(model="m", mode=mode),
        sampling=SamplingConfig(),
        trainer=TrainerConfig(),
        loss=loss or LossConfig(),
        advantage=AdvantageConfig(),
        rollout=RolloutConfig(env_id="vime/Math-v0"),
        agent=AgentConfig(),
        serve=ServeConfig(model="m"),
    )


def test_async_runs_built_in_python_get_truncated_importance_sampling() -> None:
    assert python_setup("async").loss.tis_cap == 2.0
    assert python_setup("async", LossConfig(tis_cap=5.0)).loss.tis_cap == 5.0
    assert python_setup("sync").loss.tis_cap is None


def test_over_sampling_launches_the_ceiling_of_the_wanted_groups() -> None:
    assert RolloutConfig(env_id="e", over_sampling=1.5).launch_budget(3) == 5
    assert RolloutConfig(env_id="e").launch_budget(3) == 3


def test_the_dry_run_states_the_loss_defaults_in_effect() -> None:
    from vime.orchestration.run import describe

    text = describe(python_setup("async", LossConfig(policy_loss="gspo")), "CPU")
    assert "loss: gspo (clip 0.0003/0.0004, seq-mean-token-mean, TIS cap 2)" in text
