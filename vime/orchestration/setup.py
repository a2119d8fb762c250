"""Everything a run needs, parsed once: the root config of ``vime train``.

The model path and the seed live in :class:`RunConfig`, the sampling options in one
:class:`SamplingConfig`; the component configs that also need them (the trainer loads the
model and divides logits by the temperature, the engines serve the model, the rollouts
derive episode seeds) get them as views, set here and nowhere else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from vime.agents.config import AgentConfig
from vime.algorithms.config import AdvantageConfig, LossConfig
from vime.errors import ConfigError
from vime.inference.config import ServeConfig
from vime.inference.sampling import SamplingConfig
from vime.orchestration.config import RunConfig
from vime.orchestration.placement import PlacementConfig
from vime.rollout.config import RolloutConfig
from vime.training.base import TrainerConfig

# The TIS cap (Yao et al. 2025) of async runs that set no --tis-cap.
ASYNC_TIS_CAP = 2.0


@dataclass(frozen=True)
class TrainSetup:
    """The configs of every component of ``vime train``."""

    run: RunConfig
    sampling: SamplingConfig
    trainer: TrainerConfig
    loss: LossConfig
    advantage: AdvantageConfig
    rollout: RolloutConfig
    agent: AgentConfig
    serve: ServeConfig
    megatron_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.sampling.temperature <= 0:
            # The trainer divides logits by it; greedy rollouts have no policy to train.
            raise ConfigError(
                f"--temperature must be > 0 for training, got {self.sampling.temperature}"
            )
        views = {
            "trainer": replace(
                self.trainer,
                hf_checkpoint=self.run.model,
                seed=self.run.seed,
                rollout_temperature=self.sampling.temperature,
            ),
            "serve": replace(self.serve, model=self.run.model),
            "rollout": replace(
                self.rollout, seed=self.run.seed, env_kwargs=_env_kwargs(self.run.env_kwargs)
            ),
        }
        if self.run.mode == "async" and self.loss.tis_cap is None:
            # Async rollouts are off-policy by up to --max-staleness versions: correct for it
            # with truncated importance sampling, for every caller of run_training().
            views["loss"] = replace(self.loss, tis_cap=ASYNC_TIS_CAP)
        for name, view in views.items():
            object.__setattr__(self, name, view)

    def placement(self, device: str) -> PlacementConfig:
        """The placement inputs implied by these configs on ``device`` (GPU or CPU)."""
        return PlacementConfig(
            device=device,  # type: ignore[arg-type]
            trainer_processes=self.run.trainer_num_processes,
            num_engines=self.serve.rollout_num_engines,
            gpus_per_engine=self.serve.rollout_num_gpus_per_engine,
            colocate=self.run.colocate,
            trainer_resource=self.run.trainer_resource,
            engine_resource=self.run.engine_resource,
        )

    def with_model(self, path: str) -> TrainSetup:
        """The same setup with the model path resolved (trainer and engines load it)."""
        return replace(self, run=replace(self.run, model=path))


def _env_kwargs(text: str | None) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--env-kwargs {text!r} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--env-kwargs must be a JSON object, got {text!r}")
    return value
