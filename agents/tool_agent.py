"""The built-in agent loop: single-turn or multi-turn tool calling against a Vime env.

``run(env, llm, sampling)`` resets the env, then alternates engine turns and env steps until
the env terminates or truncates, the turn limit or the context limit is hit, and returns the
episode as a token-level :class:`~vime.types.Trajectory`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vime.agents.config import AgentConfig
from vime.agents.session import ContextLimitReached, LLMSession
from vime.agents.template import ChatTemplateRenderer
from vime.inference.errors import ContextTooLong
from vime.inference.sampling import Sampler, SamplingConfig
from vime.types import Message, Status, Trajectory


class Episode:
    """One episode's live state, so a caller that cancels or times it out can still build
    the partial trajectory (see :meth:`trajectory`)."""

    def __init__(
        self,
        env: Any,
        llm: Sampler,
        sampling: SamplingConfig | dict | None,
        config: AgentConfig | None = None,
        *,
        renderer: ChatTemplateRenderer | None = None,
        task: dict | None = None,
        seed: int | None = None,
        session_id: str | None = None,
        sampling_seed: int | None = None,
    ) -> None:
        self.env = env
        self.config = config or AgentConfig()
        self.task = task
        self.seed = seed
        parse: Callable[[str], Message] | None = None
        if self.config.tool_parser is None and hasattr(env, "parse_action"):
            parse = env.parse_action
        self.session = LLMSession(
            llm,
            sampling,
            self.config,
            renderer=renderer,
            parse=parse,
            session_id=session_id,
            seed=sampling_seed,
        )
        self.messages: list[Message] = []
        self.turn_rewards: list[float] = []
        self.metrics: dict[str, float] = {}
        self.info: dict[str, Any] = {}  # the env's info of the last step
        self.status = Status.TRUNCATED
        self.stop_reason = ""
        self.started = time.monotonic()

    async def play(self) -> None:
        """Run the episode to its end; env and engine errors propagate to the caller."""
        options = {"task": self.task} if self.task is not None else None
        observation, _info = await self.env.areset(seed=self.seed, options=options)
        self.messages = list(observation)
        tools = list(self.env.tool_schemas or [])
        for _ in range(self.config.max_turns):
            try:
                action = await self.session.complete(self.messages, tools)
            except (ContextLimitReached, ContextTooLong) as exc:
                self.status, self.stop_reason = Status.TRUNCATED, f"context: {exc}"
                await self._finish()
                return
            if self.session.context_full:
                # The reply was cut by the context window: not a move the env should grade.
                self.messages.append(action)
                limit = self.config.max_context_tokens
                self.status, self.stop_reason = Status.TRUNCATED, f"context: reached {limit} tokens"
                await self._finish()
                return
            self.messages.append(action)
            observation, reward, terminated, truncated, info = await self.env.astep(action)
            self.turn_rewards.append(float(reward))
            self.messages.extend(observation)
            self.info = dict(info or {})
            self._add_metrics(info)
            if terminated:
                self.status, self.stop_reason = Status.COMPLETED, "terminated"
                return
            if truncated:
                self.status, self.stop_reason = Status.TRUNCATED, "env truncated"
                return
        self.status, self.stop_reason = Status.TRUNCATED, f"max_turns={self.config.max_turns}"
        await self._finish()

    async def _finish(self) -> None:
        """An env that grades episodes cut short from outside (RepoFix-v0 grades the
        repository as it is) has ``afinish() -> (reward, info)``: that reward ends the list."""
        finish = getattr(getattr(self.env, "unwrapped", self.env), "afinish", None)
        if finish is not None:
            reward, info = await finish()
            self.turn_rewards.append(float(reward))
            self.info = dict(info or {})
            self._add_metrics(info)

    def outcome(self) -> dict[str, Any]:
        """What graders and reports read: the env's ``correct`` flag and answer (when it gives
        them: its ``answer_key``, the answer's class for maj@k, else its extracted answer),
        the last turn's finish reason and the requests the turns took."""
        turns = self.session.turns
        key = "answer_key" if "answer_key" in self.info else "extracted_answer"
        answer = self.info.get(key)
        correct = self.info.get("correct")
        return {
            "correct": None if correct is None else bool(correct),
            "answer": None if answer in (None, "") else str(answer),
            "finish_reason": turns[-1].finish_reason if turns else "",
            "attempts": sum(t.attempts for t in turns),
            "trainable": all(t.trainable for t in turns),
        }

    def _add_metrics(self, info: dict | None) -> None:
        for key, value in (info or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.metrics[key] = self.metrics.get(key, 0.0) + float(value)

    def trajectory(
        self,
        status: Status | None = None,
        error: str | None = None,
        *,
        task_id: str = "",
        sample_index: int = 0,
    ) -> Trajectory:
        """The trajectory so far, with ``status`` (default: how :meth:`play` ended)."""
        status = self.status if status is None else status
        metrics = {**self.metrics, "episode_seconds": time.monotonic() - self.started}
        return self.session.builder.build(
            messages=list(self.messages),
            reward=sum(self.turn_rewards),
            turn_rewards=self.turn_rewards,
            status=status,
            task_id=task_id,
            sample_index=sample_index,
            error=error,
            metrics=metrics,
            metadata={
                "stop_reason": self.stop_reason or (error or ""),
                "session_id": self.session.session_id,
                **self.outcome(),
            },
        )


async def run(
    env: Any,
    llm: Sampler,
    sampling: SamplingConfig | dict | None,
    config: AgentConfig | None = None,
    *,
    renderer: ChatTemplateRenderer | None = None,
    task: dict | None = None,
    seed: int | None = None,
) -> Trajectory:
    """Play one episode of ``env`` with ``llm`` and return its trajectory.

    Never raises for env, tool or engine errors: they end the episode with status ``failed``
    and the reason in ``error``. ``renderer`` is required in the default token-in mode.
    """
    episode = Episode(env, llm, sampling, config, renderer=renderer, task=task, seed=seed)
    try:
        await episode.play()
    except Exception as exc:
        return episode.trajectory(Status.FAILED, describe_error(exc))
    return episode.trajectory()


def describe_error(exc: BaseException) -> str:
    """A one-line reason for a failed episode: the exception type and its message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
