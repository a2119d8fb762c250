"""``vime.Env``: the gymnasium.Env every Vime environment subclasses, and ``vime.ToolEnv``,
an Env whose tool calls run by themselves."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import gymnasium

from vime.envs.grading import GraderCrashed, GraderTimeout
from vime.envs.spaces import AssistantMessage, ChatMessages, message_problem
from vime.envs.tools import Tool, ToolOutcome, execute_tool_calls
from vime.errors import EnvError
from vime.types import Message

T = TypeVar("T")
log = logging.getLogger(__name__)
StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]

# --- the bounded pool that runs sync envs for areset/astep -------------------------------------

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = int(os.environ.get("VIME_ENV_THREADS", "32"))


def set_env_threads(max_workers: int) -> None:
    """Bound the threads that run sync envs' ``reset``/``step`` behind ``areset``/``astep``.

    The default is 32, or ``$VIME_ENV_THREADS``. It caps how many sync env calls run at once
    in this process; async-native envs do not use it.
    """
    global _pool, _pool_size
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    with _pool_lock:
        old, _pool, _pool_size = _pool, None, max_workers
    if old is not None:
        old.shutdown(wait=False)


def env_threads() -> int:
    """The current bound of the sync-env thread pool."""
    return _pool_size


async def run_in_env_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Await ``fn(*args, **kwargs)`` run in the bounded env thread pool."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_pool_size, thread_name_prefix="vime-env")
        pool = _pool
    return await asyncio.get_running_loop().run_in_executor(
        pool, functools.partial(fn, *args, **kwargs)
    )


# --- tools -----------------------------------------------------------------------------------


class ToolMessages(list[Message]):
    """The tool messages answering one assistant message, with what happened to each call."""

    def __init__(self, outcomes: Iterable[ToolOutcome]):
        self.outcomes = list(outcomes)
        super().__init__(o.to_message() for o in self.outcomes)

    @property
    def metrics(self) -> dict[str, int]:
        """Per-turn counts: ``tool_calls``, ``tool_errors`` and ``tool_errors/<kind>`` when > 0."""
        metrics = {"tool_calls": len(self.outcomes), "tool_errors": 0}
        for outcome in self.outcomes:
            if outcome.error is not None:
                metrics["tool_errors"] += 1
                key = f"tool_errors/{outcome.error_kind}"
                metrics[key] = metrics.get(key, 0) + 1
        return metrics


@functools.cache
def _tool_attributes(cls: type) -> tuple[str, ...]:
    return tuple(
        name for name in dir(cls) if isinstance(inspect.getattr_static(cls, name, None), Tool)
    )


def _overrides(env: Env, name: str) -> bool:
    return getattr(type(env), name) is not getattr(Env, name)


# --- the environment -------------------------------------------------------------------------


class Env(gymnasium.Env[list[Message], Message | str]):
    """A chat environment with the gymnasium API.

    Observations are lists of chat messages to append to the conversation: ``reset`` returns
    the opening messages (system/user), ``step`` the env's answer (user or tool messages, maybe
    none). Actions are the model's assistant message, an OpenAI dict whose ``tool_calls`` are
    already parsed, or its raw text, parsed with the tool-call parser named by
    ``tool_parser``; :meth:`parse_action` turns either into a message. ``options["task"]`` of
    ``reset`` carries one task (a dataset row) when the caller picks it.

    Episode ends follow gymnasium exactly:

    - ``terminated``: the task itself reached a terminal state (the answer was graded, the game
      was won or lost). Nothing follows it, so its value is 0 and a trainer must not bootstrap.
    - ``truncated``: something outside the task cut the episode short (a turn limit such as
      :class:`vime.envs.wrappers.MaxTurns`, a token or time budget). The state was not terminal.

    Rewards are per turn; ``info`` carries per-turn metrics as numbers (for tool turns
    ``tool_calls`` and ``tool_errors``) next to anything else the env reports. Tool errors
    never raise: they come back to the model as tool messages and are counted.

    Tools are the :func:`vime.tool` methods of the class and any :class:`vime.envs.tools.Tool`
    set as an instance attribute; :attr:`tool_schemas` gives their OpenAI schemas.

    Write ``reset``/``step`` for a sync env or ``areset``/``astep`` for an async one; the other
    pair comes for free (sync code runs in a bounded thread pool, see :func:`set_env_threads`;
    async code runs on an event loop of the env's own when called synchronously). One instance
    runs one episode at a time; run concurrent episodes on separate instances.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    tool_parser: str = "hermes"
    tool_timeout: float = 30.0

    def __init__(self, *, tool_parser: str | None = None, tool_timeout: float | None = None):
        if tool_parser is not None:
            from vime.tool_parsers import get_parser

            get_parser(tool_parser)  # fail now, with the list of known parsers
            self.tool_parser = tool_parser
        if tool_timeout is not None:
            self.tool_timeout = tool_timeout

    # spaces are built lazily so that subclasses need not call __init__ and may add tools there
    @property
    def observation_space(self) -> gymnasium.Space:  # type: ignore[override]
        """A :class:`~vime.envs.spaces.ChatMessages` space unless a subclass sets its own."""
        if "_observation_space" not in self.__dict__:
            self._observation_space = ChatMessages()
        return self._observation_space

    @observation_space.setter
    def observation_space(self, space: gymnasium.Space) -> None:
        self._observation_space = space

    @property
    def action_space(self) -> gymnasium.Space:  # type: ignore[override]
        """An :class:`~vime.envs.spaces.AssistantMessage` space that knows the tool names."""
        if "_action_space" not in self.__dict__:
            self._action_space = AssistantMessage(tool_names=sorted(self.tools))
        return self._action_space

    @action_space.setter
    def action_space(self, space: gymnasium.Space) -> None:
        self._action_space = space

    # --- tools ---
    @property
    def tools(self) -> dict[str, Tool]:
        """This env's tools by name: ``@vime.tool`` methods and Tool instance attributes."""
        found: dict[str, Tool] = {}
        bound = [getattr(self, name) for name in _tool_attributes(type(self))]
        for tool in [*bound, *(v for v in vars(self).values() if isinstance(v, Tool))]:
            if tool.name in found and found[tool.name] is not tool:
                raise EnvError(
                    f"{type(self).__name__} has two tools named {tool.name!r}; give one of them "
                    f"another name with @vime.tool(name=...)"
                )
            found[tool.name] = tool
        return found

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of :attr:`tools`, to pass as ``tools=`` to the model."""
        return [tool.schema for tool in self.tools.values()]

    def parse_action(self, action: Message | str) -> Message:
        """The assistant message of ``action``, with its tool calls in OpenAI format.

        A str is parsed with this env's ``tool_parser``; so is the content of a dict that has no
        ``tool_calls`` key (a model served without a tool parser). A dict that has the key is
        trusted as parsed. An env without tools parses nothing: a reply that mentions
        ``<tool_call>`` is all content. Anything else is a programming error and raises
        :class:`EnvError`.
        """
        if isinstance(action, str) and not self.tools:
            return {"role": "assistant", "content": action}
        if isinstance(action, str):
            from vime.tool_parsers import get_parser, to_assistant_message

            parser = get_parser(self.tool_parser)
            return to_assistant_message(parser.parse(action, tools=self.tool_schemas))
        if not isinstance(action, dict):
            raise EnvError(
                f"an action must be the model's assistant message (dict) or its text (str), "
                f"got {type(action).__name__}: {action!r:.200}"
            )
        problem = message_problem(action, ("assistant",))
        if problem is not None:
            raise EnvError(f"invalid action {action!r:.200}: {problem}")
        if "tool_calls" not in action and isinstance(action.get("content"), str):
            return {**action, **self.parse_action(action["content"])}
        message = {k: v for k, v in action.items() if k != "tool_calls"}
        if action.get("tool_calls"):
            message["tool_calls"] = [dict(call) for call in action["tool_calls"]]
        return message

    async def arun_tools(self, message: Message) -> ToolMessages:
        """Run the tool calls of an assistant message; errors become tool messages, counted."""
        calls = message.get("tool_calls") or []
        if not calls:
            return ToolMessages([])
        return ToolMessages(await execute_tool_calls(self.tools, calls, timeout=self.tool_timeout))

    def run_tools(self, message: Message) -> ToolMessages:
        """Sync :meth:`arun_tools` (runs on this env's own event loop)."""
        return self._run_sync(self.arun_tools(message))

    # --- the gymnasium API, sync and async ---
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode; returns the opening messages and an info dict.

        Subclasses call ``super().reset(seed=seed)`` first so that ``self.np_random`` is seeded.
        """
        if _overrides(self, "areset") and not _overrides(self, "reset"):
            return self._run_sync(self.areset(seed=seed, options=options))
        self._require("reset", "areset")
        return super().reset(seed=seed, options=options)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Async :meth:`reset`. Async subclasses call ``await super().areset(seed=seed)`` first."""
        if _overrides(self, "reset") and not _overrides(self, "areset"):
            return await run_in_env_thread(self.reset, seed=seed, options=options)
        self._require("reset", "areset")
        return gymnasium.Env.reset(self, seed=seed, options=options)

    def step(self, action: Message | str) -> StepResult:
        """Take the model's turn; returns ``(messages, reward, terminated, truncated, info)``."""
        if _overrides(self, "astep") and not _overrides(self, "step"):
            return self._run_sync(self.astep(action))
        raise NotImplementedError(f"{type(self).__name__} must implement step() or astep()")

    async def astep(self, action: Message | str) -> StepResult:
        """Async :meth:`step`."""
        if _overrides(self, "step") and not _overrides(self, "astep"):
            return await run_in_env_thread(self.step, action)
        raise NotImplementedError(f"{type(self).__name__} must implement step() or astep()")

    def close(self) -> None:
        """Release what the env holds (its event loop for sync calls of async code)."""
        finalizer = self.__dict__.pop("_loop_finalizer", None)
        if finalizer is not None:
            finalizer()
        self.__dict__.pop("_loop", None)
        super().close()

    def __getstate__(self) -> dict[str, Any]:
        # the loop thread stays behind: a copy (pickled to a worker) starts its own on first use
        return {k: v for k, v in self.__dict__.items() if k not in ("_loop", "_loop_finalizer")}

    def _require(self, sync: str, asynchronous: str) -> None:
        if not (_overrides(self, sync) or _overrides(self, asynchronous)):
            raise NotImplementedError(
                f"{type(self).__name__} must implement {sync}() or {asynchronous}()"
            )

    def _run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine to completion on this env's own loop thread (created on first use).

        One loop per env keeps loop-bound resources (clients, sandboxes) valid across calls and
        works whether or not the caller's thread runs an event loop.
        """
        loop: asyncio.AbstractEventLoop | None = self.__dict__.get("_loop")
        if loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=_serve_loop, args=(loop,), daemon=True)
            thread.name = f"vime-env-loop-{type(self).__name__}"
            thread.start()
            self._loop = loop
            self._loop_finalizer = weakref.finalize(self, loop.call_soon_threadsafe, loop.stop)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            coro.close()
            raise EnvError(
                f"a sync method of {type(self).__name__} was called from its own async code; "
                f"await the async version (areset/astep/arun_tools) instead"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()


def _serve_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


class ToolEnv(Env):
    """An :class:`Env` whose assistant turns with tool calls run the tools by themselves.

    A turn with tool calls returns the tool messages, reward 0 and the tool metrics; a turn
    without them goes to :meth:`answer`, which subclasses write (with ``reset``). An
    ``answer`` that grades untrusted text with heavy work can be marked
    ``@vime.heavy(timeout=...)``: it then runs in a killable grading worker, and past its time
    limit the turn scores 0, ends the episode and reports ``info["grader_timeout"]``.
    """

    def answer(self, message: Message) -> StepResult:
        """Handle an assistant message that calls no tool (usually: grade it and terminate)."""
        raise NotImplementedError(f"{type(self).__name__} must implement answer(message)")

    def step(self, action: Message | str) -> StepResult:
        """Run the tools the action calls, or hand the message to :meth:`answer`."""
        message = self.parse_action(action)
        if message.get("tool_calls"):
            results = self.run_tools(message)
            return list(results), 0.0, False, False, results.metrics
        return self._answer(message)

    async def astep(self, action: Message | str) -> StepResult:
        """Async :meth:`step`: tools run on the caller's loop, ``answer`` in the thread pool."""
        message = self.parse_action(action)
        if message.get("tool_calls"):
            results = await self.arun_tools(message)
            return list(results), 0.0, False, False, results.metrics
        return await run_in_env_thread(self._answer, message)

    def _answer(self, message: Message) -> StepResult:
        try:
            observation, reward, terminated, truncated, info = self.answer(message)
        except (GraderTimeout, GraderCrashed) as exc:  # a heavy answer() (vime.heavy) failed
            log.warning("%s.answer: %s; the answer scores 0", type(self).__name__, exc)
            key = "grader_timeout" if isinstance(exc, GraderTimeout) else "grader_crashed"
            observation, reward, terminated, truncated, info = [], 0.0, True, False, {key: 1.0}
        return (
            observation,
            reward,
            terminated,
            truncated,
            {"tool_calls": 0, "tool_errors": 0, **info},
        )
