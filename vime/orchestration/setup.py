"""Everything a run needs, parsed once: one typed config per component."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from vime.orchestration.config import RunConfig
from vime.orchestration.placement import PlacementConfig


@dataclass
class TrainSetup:
    """The configs of every component of ``vime train``."""

    run: RunConfig
    trainer: Any  # vime.training.TrainerConfig
    loss: Any  # vime.algorithms.LossConfig
    advantage: Any  # vime.algorithms.AdvantageConfig
    rollout: Any  # vime.rollout.RolloutConfig
    agent: Any  # vime.agents.AgentConfig
    serve: Any  # vime.inference.config.ServeConfig
    megatron_args: list[str]

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
        return replace(
            self,
            run=replace(self.run, model=path),
            trainer=replace(self.trainer, hf_checkpoint=path),
            serve=replace(self.serve, model=path),
        )
