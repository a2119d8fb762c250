"""The rollout manager's options, as one typed config (flags are generated from it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vime.config.schema import option
from vime.errors import ConfigError


@dataclass
class RolloutConfig:
    """What to roll out and how much of it at once."""

    env_id: str = option(help="env id, e.g. vime/MathTool-v0", flag="--env")
    n: int = option(4, help="episodes per task (the group size)")
    max_concurrency: int = option(64, help="episodes running at once, over all envs")
    env_concurrency: int | None = option(
        None, help="episodes running at once per env id (default: --max-concurrency)"
    )
    episode_timeout: float | None = option(
        600.0, help="seconds before an episode is stopped and marked failed"
    )
    over_sampling: float = option(
        1.0,
        help="launch up to this many times the wanted groups, for the group filter to choose from",
    )
    group_filter: str | None = option(
        None,
        help="dynamic-sampling hook: nonzero_reward_variance, no_failures, or 'pkg.module:func' "
        "(a callable when built in Python)",
    )
    partial_rollout: bool = option(
        False, help="carry unfinished groups into the next batch instead of aborting them"
    )
    seed: int = option(0, help="base seed; episode seeds derive from it")
    env_kwargs: dict[str, Any] = option({}, help="keyword arguments for vime.make", cli=False)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"--n must be >= 1, got {self.n}")
        if self.max_concurrency < 1:
            raise ConfigError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        if self.env_concurrency is not None and self.env_concurrency < 1:
            raise ConfigError(f"--env-concurrency must be >= 1, got {self.env_concurrency}")
        if self.episode_timeout is not None and self.episode_timeout <= 0:
            raise ConfigError(f"--episode-timeout must be > 0, got {self.episode_timeout}")
        if self.over_sampling < 1.0:
            raise ConfigError(f"--over-sampling must be >= 1.0, got {self.over_sampling}")

    def launch_budget(self, num_groups: int) -> int:
        """Groups to launch for ``num_groups`` wanted: ``ceil(num_groups * over_sampling)``;
        the extra ones give ``--group-filter`` groups to choose from."""
        return math.ceil(num_groups * self.over_sampling)
