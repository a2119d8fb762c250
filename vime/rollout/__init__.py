"""Rollouts: groups of trajectories per task from an env, with concurrency limits, timeouts,
dynamic sampling, partial rollout, abort and JSONL dumps."""

from vime.rollout.config import RolloutConfig
from vime.rollout.dump import read_jsonl, write_jsonl
from vime.rollout.filters import load_hook, nonzero_reward_variance
from vime.rollout.manager import RolloutBatch, RolloutManager

__all__ = [
    "RolloutBatch",
    "RolloutConfig",
    "RolloutManager",
    "load_hook",
    "nonzero_reward_variance",
    "read_jsonl",
    "write_jsonl",
]
