"""Cross-cutting features as gymnasium wrappers whose async methods pass through."""

from __future__ import annotations

from typing import Any

import gymnasium

from vime.envs.base import StepResult, run_in_env_thread
from vime.types import Message


async def areset(
    env: gymnasium.Env, *, seed: int | None = None, options: dict[str, Any] | None = None
) -> tuple[list[Message], dict[str, Any]]:
    """``env.areset`` when it has one, else its sync ``reset`` in the env thread pool.

    This lets Vime wrappers sit on top of plain gymnasium wrappers (which have no async API).
    """
    if hasattr(env, "areset"):
        return await env.areset(seed=seed, options=options)
    return await run_in_env_thread(env.reset, seed=seed, options=options)


async def astep(env: gymnasium.Env, action: Message | str) -> StepResult:
    """``env.astep`` when it has one, else its sync ``step`` in the env thread pool."""
    if hasattr(env, "astep"):
        return await env.astep(action)
    return await run_in_env_thread(env.step, action)


class Wrapper(gymnasium.Wrapper):
    """A gymnasium wrapper that also passes ``areset``/``astep`` and the tool API through."""

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Async :meth:`reset` of the wrapped env."""
        return await areset(self.env, seed=seed, options=options)

    async def astep(self, action: Message | str) -> StepResult:
        """Async :meth:`step` of the wrapped env."""
        return await astep(self.env, action)

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The wrapped env's tool schemas."""
        return self.env.get_wrapper_attr("tool_schemas")

    @property
    def tools(self) -> dict[str, Any]:
        """The wrapped env's tools."""
        return self.env.get_wrapper_attr("tools")

    def parse_action(self, action: Message | str) -> Message:
        """The wrapped env's :meth:`vime.Env.parse_action`."""
        return self.env.get_wrapper_attr("parse_action")(action)


class MaxTurns(Wrapper):
    """Truncate an episode after ``max_turns`` steps (gymnasium's ``truncated``, not an end of
    the task: ``terminated`` stays as the env said). ``info["max_turns_reached"]`` marks it."""

    def __init__(self, env: gymnasium.Env, max_turns: int):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        super().__init__(env)
        self.max_turns = max_turns
        self.turns = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Reset the wrapped env and the turn count."""
        self.turns = 0
        return self.env.reset(seed=seed, options=options)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Async :meth:`reset`."""
        self.turns = 0
        return await super().areset(seed=seed, options=options)

    def step(self, action: Message | str) -> StepResult:
        """Step the wrapped env; truncate once ``max_turns`` steps were taken."""
        return self._count(self.env.step(action))

    async def astep(self, action: Message | str) -> StepResult:
        """Async :meth:`step`."""
        return self._count(await super().astep(action))

    def _count(self, result: StepResult) -> StepResult:
        observation, reward, terminated, truncated, info = result
        self.turns += 1
        if self.turns >= self.max_turns and not terminated and not truncated:
            return observation, reward, False, True, {**info, "max_turns_reached": True}
        return result
