"""Options of the RL loop itself (``vime train``); each component keeps its own config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vime.config.schema import option
from vime.errors import ConfigError


@dataclass
class RunConfig:
    """The RL run: model, seed, data, steps, loop mode, placement, checkpoints, eval, logging
    (sampling is :class:`~vime.inference.sampling.SamplingConfig`)."""

    model: str = option(
        help="HF model folder the trainer starts from and the engines serve; 'smollm2' means "
        "the bundled SmolLM2-135M-Instruct (converted on first use)"
    )
    tasks: str | None = option(
        None, help="JSONL/Parquet file of training tasks (default: the env's own generator)"
    )
    env_kwargs: str | None = option(
        None, help='keyword arguments for the env as JSON, e.g. \'{"sandbox": "docker"}\''
    )
    eval_tasks: str | None = option(
        None, help="held-out JSONL/Parquet tasks for --eval-interval (default: generated)"
    )
    output_dir: str = option("runs/latest", help="folder for checkpoints, logs, dumps, exports")
    num_steps: int = option(10, help="optimizer steps to run")
    rollout_batch_size: int = option(8, help="tasks per step (each played --n times)")
    mode: Literal["sync", "async"] = option(
        "sync", help="sync: on-policy, rollout then train; async: rollouts overlap training"
    )
    max_staleness: int = option(
        1, help="async mode: drop trajectories sampled more than K weight versions ago"
    )
    colocate: bool = option(
        False, help="trainer and engines share devices; engines are paused while training"
    )
    trainer_num_processes: int = option(1, help="trainer processes (FSDP ranks / GPUs)")
    ray_address: str | None = option(
        None, help="join this Ray cluster ('auto' or host:port) instead of starting one"
    )
    trainer_resource: str | None = option(
        None, help="custom Ray resource the trainer's node has (pins the trainer there)"
    )
    engine_resource: str | None = option(
        None, help="custom Ray resource the engines' node has (pins the engines there)"
    )
    save_interval: int = option(0, help="checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = option(2, help="checkpoints to keep on disk")
    export_interval: int = option(0, help="export an HF folder every N steps (0: only at the end)")
    eval_interval: int = option(
        0,
        help="evaluate on held-out tasks the starting weights and those of every N-th step "
        "(0: never); each evaluation runs beside the next step's rollouts and is logged as "
        "a row of its own step",
    )
    eval_size: int = option(16, help="held-out tasks per evaluation")
    resume: bool = option(False, help="continue from the latest checkpoint in --output-dir")
    wandb_project: str | None = option(None, help="also log to this wandb project")
    dump_trajectories: bool = option(
        True, help="write every step's trajectories to <output-dir>/trajectories/"
    )
    device: Literal["auto", "gpu", "cpu"] = option(
        "auto",
        help="what a placement bundle holds; auto: GPU when CUDA is visible (for planning "
        "a GPU run from a laptop with --dry-run, say gpu)",
    )
    dry_run: bool = option(
        False, help="validate the config, print the placement plan, start nothing"
    )
    seed: int = option(0, help="seed of the whole run (data order, sampling, trainer)")

    def __post_init__(self) -> None:
        positive = {
            "--num-steps": self.num_steps,
            "--rollout-batch-size": self.rollout_batch_size,
            "--trainer-num-processes": self.trainer_num_processes,
            "--eval-size": self.eval_size,
        }
        for flag, value in positive.items():
            if value < 1:
                raise ConfigError(f"{flag} must be >= 1, got {value}")
        for flag, value in {
            "--save-interval": self.save_interval,
            "--export-interval": self.export_interval,
            "--eval-interval": self.eval_interval,
            "--max-staleness": self.max_staleness,
        }.items():
            if value < 0:
                raise ConfigError(f"{flag} must be >= 0, got {value}")
        if self.mode == "async" and self.colocate:
            raise ConfigError(
                "--mode async overlaps rollouts with training, which needs separate devices: "
                "drop --colocate or use --mode sync"
            )
        if self.keep_checkpoints < 1:
            raise ConfigError(f"--keep-checkpoints must be >= 1, got {self.keep_checkpoints}")
