"""The rollout manager: from tasks and an env id, groups of n trajectories per task, with
concurrency limits, per-episode timeouts, dynamic sampling, partial rollout and abort.

Every episode is isolated: an env, tool, sandbox or engine error (or a timeout) turns only that
trajectory into ``failed`` with the reason, and the step goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vime.agents.config import AgentConfig
from vime.agents.template import ChatTemplateRenderer
from vime.agents.tool_agent import Episode, describe_error
from vime.inference.sampling import Sampler, SamplingConfig
from vime.rollout.config import RolloutConfig
from vime.rollout.filters import load_hook
from vime.types import Status, Trajectory

EnvFactory = Callable[[str], Any]
LLMFactory = Callable[[], Sampler]


@dataclass
class RolloutBatch:
    """What one :meth:`RolloutManager.generate` call produced."""

    groups: list[list[Trajectory]]
    dropped: list[list[Trajectory]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def trajectories(self) -> list[Trajectory]:
        """The kept trajectories, group after group."""
        return [t for g in self.groups for t in g]


def _default_env_factory(env_id: str, **kwargs: Any) -> Any:
    import vime

    return vime.make(env_id, **kwargs)


class RolloutManager:
    """Plays episodes of ``config.env_id`` (or a task's ``env`` key) with fresh env instances.

    ``llm_factory()`` gives the LLM client for one episode (one session). With
    ``config.partial_rollout`` the groups still running when a batch is full are kept running
    and returned first by the next :meth:`generate`, so episodes straddle a weight update with
    their older tokens tagged by ``token_versions``; otherwise they are aborted and discarded.
    """

    def __init__(
        self,
        config: RolloutConfig,
        llm_factory: LLMFactory,
        agent_config: AgentConfig | None = None,
        *,
        renderer: ChatTemplateRenderer | None = None,
        env_factory: EnvFactory | None = None,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> None:
        self.config = config
        self.llm_factory = llm_factory
        self.agent_config = agent_config or AgentConfig()
        self.renderer = renderer
        self.env_factory = env_factory or (
            lambda env_id: _default_env_factory(env_id, **config.env_kwargs)
        )
        self.on_trajectory = on_trajectory
        self.group_filter = load_hook(config.group_filter)
        self._global = asyncio.Semaphore(config.max_concurrency)
        self._per_env: dict[str, asyncio.Semaphore] = {}
        self._carried: list[asyncio.Task] = []
        self._episodes: set[asyncio.Task] = set()
        # The episode tasks of each running group, to cancel a group's episodes one by one.
        self._group_episodes: dict[asyncio.Future, list[asyncio.Task]] = {}
        self._abort = asyncio.Event()
        self._group_counter = 0

    def abort(self) -> None:
        """Stop launching episodes and cancel the running ones (they come back ``aborted``)."""
        self._abort.set()
        for task in list(self._episodes):
            task.cancel()

    async def generate(
        self,
        tasks: Sequence[dict | int],
        sampling: SamplingConfig,
        *,
        num_groups: int | None = None,
    ) -> RolloutBatch:
        """Play ``config.n`` episodes per task until ``num_groups`` groups (default: one per
        task) pass the group filter, launching at most ``config.launch_budget(num_groups)``
        new groups; groups carried over from the previous call come first.

        A task is a dataset row (passed to the env as ``options["task"]``) or an int ``k``:
        the env draws its own task from seed ``config.seed + k``.
        """
        self._abort.clear()
        target = len(tasks) if num_groups is None else num_groups
        budget = min(len(tasks), self.config.launch_budget(target))
        started = time.monotonic()
        carried = set(self._carried)
        pending: set[asyncio.Task] = set(carried)
        self._carried = []
        queue = list(tasks[:budget])
        kept: list[list[Trajectory]] = []
        dropped: list[list[Trajectory]] = []
        launched = 0
        while pending or queue:
            # Keep enough groups in flight to fill every episode slot, but no more.
            while (
                queue
                and not self._abort.is_set()
                and self._in_flight(pending) < self.config.max_concurrency
            ):
                pending.add(self._launch_group(queue.pop(0), sampling))
                launched += 1
            if not pending:
                break
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.cancelled():
                    continue  # cancelled before any episode could return a trajectory
                group = task.result()
                if task in carried:
                    for trajectory in group:
                        trajectory.metadata["carried_over"] = True
                if len(kept) < target and not self._abort.is_set() and self.group_filter(group):
                    kept.append(group)
                else:
                    dropped.append(group)
            if len(kept) >= target or self._abort.is_set():
                queue.clear()
                if pending and self.config.partial_rollout and not self._abort.is_set():
                    self._carried = list(pending)
                    pending = set()
                else:
                    self._cancel(pending)
        return RolloutBatch(kept, dropped, self._metrics(kept, dropped, launched, started))

    def _in_flight(self, pending: set[asyncio.Task]) -> int:
        return len(pending) * self.config.n

    def _cancel(self, pending: set[asyncio.Task]) -> None:
        for group_task in pending:
            for task in self._group_episodes.get(group_task, ()):
                task.cancel()

    def _forget_group(self, group_task: asyncio.Future) -> None:
        self._group_episodes.pop(group_task, None)

    def _launch_group(self, task: dict | int, sampling: SamplingConfig) -> asyncio.Task:
        group_index = self._group_counter
        self._group_counter += 1
        episodes = [
            asyncio.ensure_future(self._episode(task, group_index, i, sampling))
            for i in range(self.config.n)
        ]
        self._episodes.update(episodes)
        for ep in episodes:
            ep.add_done_callback(self._episodes.discard)
        group_task = asyncio.ensure_future(asyncio.gather(*episodes))
        self._group_episodes[group_task] = episodes
        group_task.add_done_callback(self._forget_group)
        return group_task

    def _env_semaphore(self, env_id: str) -> asyncio.Semaphore:
        if env_id not in self._per_env:
            self._per_env[env_id] = asyncio.Semaphore(
                self.config.env_concurrency or self.config.max_concurrency
            )
        return self._per_env[env_id]

    async def _episode(
        self, task: dict | int, group_index: int, sample_index: int, sampling: SamplingConfig
    ) -> Trajectory:
        # An int asks the env to draw its own task from the seed; a dict is a dataset row.
        row = task if isinstance(task, dict) else None
        env_id = (row or {}).get("env") or self.config.env_id
        task_id = str(row.get("id", group_index)) if row is not None else f"seed-{task}"
        episode: Episode | None = None
        env = None
        status, error = Status.ABORTED, "aborted before it started"
        try:
            async with self._global, self._env_semaphore(env_id):
                if self._abort.is_set():
                    raise asyncio.CancelledError
                try:
                    async with asyncio.timeout(self.config.episode_timeout):
                        env = self.env_factory(env_id)
                        # One seed per group: envs that draw tasks from it give every
                        # episode of a group the same task.
                        seed = self.config.seed + (task if row is None else group_index)
                        episode = Episode(
                            env,
                            self.llm_factory(),
                            sampling,
                            self.agent_config,
                            renderer=self.renderer,
                            task=row,
                            seed=seed,
                        )
                        await episode.play()
                        status, error = episode.status, None
                except TimeoutError:
                    status = Status.FAILED
                    error = f"episode timed out after {self.config.episode_timeout}s"
                except Exception as exc:
                    status, error = Status.FAILED, describe_error(exc)
        except asyncio.CancelledError:
            status, error = Status.ABORTED, "aborted"
        finally:
            if env is not None:
                await _close_quietly(env)
        if episode is None:
            trajectory = Trajectory([], [], [], 0, status=status, error=error, task_id=task_id)
        else:
            trajectory = episode.trajectory(
                status, error, task_id=task_id, sample_index=sample_index
            )
        trajectory.metadata.update(group=group_index, env_id=env_id)
        if self.on_trajectory is not None:
            self.on_trajectory(trajectory)
        return trajectory

    def _metrics(
        self, kept: list, dropped: list, launched: int, started: float
    ) -> dict[str, float]:
        everything = [t for g in kept + dropped for t in g]
        elapsed = max(time.monotonic() - started, 1e-9)
        status = Counter(str(t.status) for t in everything)
        reasons = Counter(
            (t.error or "").split(":")[0] for t in everything if t.status is Status.FAILED
        )
        turns = sum(t.metrics.get("num_turns", 0.0) for t in everything)
        metrics: dict[str, float] = {
            "groups_launched": float(launched),
            "groups_kept": float(len(kept)),
            "groups_dropped": float(len(dropped)),
            "episodes": float(len(everything)),
            "turns": turns,
            "turns_per_s": turns / elapsed,
            "seconds": elapsed,
            "drift_count": sum(t.metrics.get("drift_count", 0.0) for t in everything),
            "groups_carried_over": float(len(self._carried)),
        }
        for name in ("completed", "truncated", "failed", "aborted"):
            metrics[f"status/{name}"] = float(status.get(name, 0))
        for reason, count in reasons.items():
            metrics[f"failed/{reason}"] = float(count)
        return metrics


async def _close_quietly(env: Any, timeout: float = 10.0) -> None:
    """Close an env without letting a stuck or failing ``close`` stall the rollout.

    A cancel that arrives while the env closes (the batch filled up meanwhile) does not
    interrupt the close, and the episode still returns its trajectory.
    """
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await asyncio.shield(asyncio.wait_for(asyncio.to_thread(env.close), timeout))
