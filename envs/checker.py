"""``vime env check`` as a Python API: API shape, seeding, tool schemas, malformed actions,
concurrent episodes, JSON observations and gymnasium's own ``check_env``, one result per check."""

from __future__ import annotations

import asyncio
import json
import math
import re
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import jsonschema

from vime.envs.base import Env
from vime.envs.spaces import message_problem
from vime.envs.wrappers import areset, astep
from vime.types import Message

EnvFactory = Callable[[], gymnasium.Env]
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TURNS = 3  # steps per episode in the determinism and concurrency checks


@dataclass
class CheckResult:
    """One check: its name, whether it passed, and a line saying what was seen."""

    name: str
    ok: bool
    detail: str


@dataclass
class CheckReport:
    """All checks of one env."""

    env: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return all(r.ok for r in self.results)

    def format(self) -> str:
        """A readable report: a line per check, then a summary."""
        width = max(len(r.name) for r in self.results)
        lines = [f"Checking {self.env}"]
        lines += [
            f"  {'PASS' if r.ok else 'FAIL'}  {r.name:<{width}}  {r.detail}" for r in self.results
        ]
        failed = sum(not r.ok for r in self.results)
        lines.append(f"{len(self.results) - failed} passed, {failed} failed")
        return "\n".join(lines)


class CheckFailed(AssertionError):
    """A check saw something wrong (the message says what)."""


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def _messages_problem(observation: Any, where: str) -> str | None:
    if not isinstance(observation, list):
        return f"{where}: observation must be a list of messages, got {type(observation).__name__}"
    for i, message in enumerate(observation):
        problem = message_problem(message)
        if problem is not None:
            return f"{where}: message {i}: {problem}"
    return None


def _check_step_result(result: Any, where: str) -> None:
    _expect(
        isinstance(result, tuple) and len(result) == 5,
        f"{where} must return a 5-tuple, got {result!r:.200}",
    )
    observation, reward, terminated, truncated, info = result
    problem = _messages_problem(observation, where)
    _expect(problem is None, str(problem))
    _expect(
        isinstance(reward, int | float) and not isinstance(reward, bool) and math.isfinite(reward),
        f"{where}: reward must be a finite float, got {reward!r}",
    )
    _expect(isinstance(terminated, bool), f"{where}: terminated must be a bool, got {terminated!r}")
    _expect(isinstance(truncated, bool), f"{where}: truncated must be a bool, got {truncated!r}")
    _expect(isinstance(info, dict), f"{where}: info must be a dict, got {type(info).__name__}")


def _episode(env: gymnasium.Env, seed: int, actions: list[Message | str]) -> list[Any]:
    """Reset with ``seed`` and play ``actions`` until the episode ends; every output, in order."""
    outputs: list[Any] = [env.reset(seed=seed)]
    for action in actions:
        outputs.append(env.step(action))
        if outputs[-1][2] or outputs[-1][3]:
            break
    return outputs


async def _aepisode(env: gymnasium.Env, seed: int, actions: list[Message | str]) -> list[Any]:
    outputs: list[Any] = [await areset(env, seed=seed)]
    for action in actions:
        outputs.append(await astep(env, action))
        if outputs[-1][2] or outputs[-1][3]:
            break
    return outputs


def _actions(env: gymnasium.Env, seed: int) -> list[Message | str]:
    space = env.action_space
    space.seed(seed)
    return [space.sample() for _ in range(_TURNS)]


def _malformed_actions(env: Env) -> list[tuple[str, Message | str, bool]]:
    """(label, action, is a tool call) for replies a model can really produce."""
    actions: list[tuple[str, Message | str, bool]] = [
        ("empty reply", "", False),
        ("10k characters of noise", "}{<tool_call>" + "\u00e9\u4e2d\U0001f600 x" * 2000, False),
        ("no content", {"role": "assistant", "content": None}, False),
        ("broken tool-call JSON", '<tool_call>{"name": "x", "arguments": {</tool_call>', True),
        ("unknown tool", '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>', True),
        (
            "bad JSON in OpenAI arguments",
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "x", "arguments": "{oops"},
                    }
                ],
            },
            True,
        ),
    ]
    for name, schema in ((t.name, t.parameters) for t in env.tools.values()):
        bad = {p: {"not": ["the", "right", "type"]} for p in schema.get("properties", {})}
        call = json.dumps({"name": name, "arguments": bad or {"unexpected": 1}})
        actions.append((f"wrong argument types for {name}", f"<tool_call>{call}</tool_call>", True))
    return actions


class _Checker:
    def __init__(self, factory: EnvFactory, seed: int, episodes: int):
        self.factory, self.seed, self.episodes = factory, seed, episodes
        self.seen: list[Any] = []  # observations and infos, for the JSON check

    def make(self) -> gymnasium.Env:
        env = self.factory()
        _expect(
            isinstance(env, gymnasium.Env),
            f"the factory returned {type(env).__name__}, not a gymnasium.Env",
        )
        return env

    def check_make(self) -> str:
        env = self.make()
        base = env.unwrapped
        _expect(isinstance(base, Env), f"{type(base).__name__} does not subclass vime.Env")
        tools = sorted(base.tools)
        return (
            f"{type(base).__name__}, {len(tools)} tool(s){': ' + ', '.join(tools) if tools else ''}"
        )

    def check_reset(self) -> str:
        env = self.make()
        result = env.reset(seed=self.seed)
        _expect(
            isinstance(result, tuple) and len(result) == 2,
            f"reset must return (observation, info), got {result!r:.200}",
        )
        observation, info = result
        problem = _messages_problem(observation, "reset")
        _expect(problem is None, str(problem))
        _expect(
            len(observation) > 0, "reset returned no messages: the model would see an empty prompt"
        )
        _expect(isinstance(info, dict), f"reset info must be a dict, got {type(info).__name__}")
        _expect(
            env.observation_space.contains(observation),
            "the observation is not in observation_space",
        )
        self.seen += [observation, info]
        roles = ", ".join(m["role"] for m in observation)
        return f"{len(observation)} message(s) ({roles}); info keys: {sorted(info) or 'none'}"

    def check_step(self) -> str:
        env = self.make()
        env.reset(seed=self.seed)
        result = env.step("I think the answer is 42.")
        _check_step_result(result, "step")
        self.seen += [result[0], result[4]]
        _, reward, terminated, truncated, info = result
        return f"reward {reward:g}, terminated={terminated}, truncated={truncated}; info keys: {sorted(info) or 'none'}"

    def check_seeding(self) -> str:
        first, second = self.make(), self.make()
        actions = _actions(first, self.seed)
        runs = [_episode(env, self.seed, actions) for env in (first, second)]
        nondeterministic = first.spec is not None and first.spec.nondeterministic
        if nondeterministic:
            _expect(
                runs[0][0] == runs[1][0], "two resets with the same seed gave different messages"
            )
            return "same seed, same opening (steps not compared: the spec says nondeterministic)"
        for i, (a, b) in enumerate(zip(*runs, strict=False)):
            _expect(
                a == b,
                f"same seed and actions, different {'reset' if i == 0 else f'step {i}'}: {a!r:.150} vs {b!r:.150}",
            )
        _expect(len(runs[0]) == len(runs[1]), "same seed and actions, different episode lengths")
        other = self.make().reset(seed=self.seed + 1)[0]
        varies = "a different" if other != runs[0][0][0] else "the same"
        return f"same seed -> same reset and {len(runs[0]) - 1} step(s); seed {self.seed + 1} gives {varies} opening"

    def check_tool_schemas(self) -> str:
        env = self.make()
        schemas = env.unwrapped.tool_schemas
        names = []
        for schema in schemas:
            function = schema.get("function", {}) if isinstance(schema, dict) else {}
            name = function.get("name")
            _expect(
                schema.get("type") == "function" and isinstance(function, dict),
                f"not an OpenAI function schema: {schema!r:.200}",
            )
            _expect(
                isinstance(name, str) and bool(_TOOL_NAME.match(name)),
                f"tool name {name!r} must match {_TOOL_NAME.pattern}",
            )
            _expect(
                bool(function.get("description")),
                f"tool {name!r} has no description: the model reads it",
            )
            parameters = function.get("parameters")
            _expect(
                isinstance(parameters, dict) and parameters.get("type") == "object",
                f"tool {name!r}: parameters must be a JSON Schema of type object",
            )
            try:
                jsonschema.Draft202012Validator.check_schema(parameters)
            except jsonschema.SchemaError as exc:
                raise CheckFailed(
                    f"tool {name!r}: parameters are not valid JSON Schema: {exc.message}"
                ) from exc
            json.dumps(schema)
            names.append(name)
        _expect(len(names) == len(set(names)), f"duplicate tool names: {names}")
        return f"{len(names)} valid schema(s)" if names else "no tools (nothing to check)"

    def check_malformed(self) -> str:
        env = self.make()
        base = env.unwrapped
        counted = 0
        cases = _malformed_actions(base)
        for label, action, is_call in cases:
            env.reset(seed=self.seed)
            try:
                result = env.step(action)
            except Exception as exc:
                raise CheckFailed(f"{label}: step raised {type(exc).__name__}: {exc}") from exc
            _check_step_result(result, f"step({label})")
            info = result[4]
            if is_call and "tool_errors" in info:
                _expect(
                    info["tool_errors"] >= 1,
                    f"{label}: info['tool_errors'] is {info['tool_errors']}, expected >= 1",
                )
                counted += 1
        note = f"; tool errors counted for {counted}" if counted else ""
        return f"{len(cases)} malformed replies answered without exceptions{note}"

    def check_concurrency(self) -> str:
        seeds = [self.seed + i for i in range(self.episodes)]
        envs = [self.make() for _ in seeds]
        plans = [_actions(env, s) for env, s in zip(envs, seeds, strict=True)]
        sequential = [_episode(self.make(), s, p) for s, p in zip(seeds, plans, strict=True)]

        async def all_at_once() -> list[list[Any]]:
            return list(
                await asyncio.gather(
                    *(_aepisode(e, s, p) for e, s, p in zip(envs, seeds, plans, strict=True))
                )
            )

        concurrent = asyncio.run(all_at_once())
        _expect(
            len({id(e.unwrapped) for e in envs}) == len(envs),
            "the factory returned the same env instance twice",
        )
        nondeterministic = envs[0].spec is not None and envs[0].spec.nondeterministic
        for seed, a, b in zip(seeds, sequential, concurrent, strict=True):
            for output in b:
                self.seen += [output[0], output[-1]]
            if nondeterministic:
                _expect(
                    a[0] == b[0], f"seed {seed}: concurrent areset differs from a sequential reset"
                )
            else:
                _expect(
                    a == b,
                    f"seed {seed}: the concurrent async episode differs from the same episode run alone: {a!r:.150} vs {b!r:.150}",
                )
        return f"{len(envs)} episodes via areset/astep at once match the same episodes run alone"

    def check_json(self) -> str:
        for item in self.seen:
            try:
                json.dumps(item, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise CheckFailed(f"not JSON-serialisable ({exc}): {item!r:.200}") from exc
        return f"{len(self.seen)} observations and infos serialise to JSON"

    def check_gymnasium(self) -> str:
        from gymnasium.utils.env_checker import check_env

        env = self.make().unwrapped
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                check_env(env, skip_render_check=True, skip_close_check=True)
            except AssertionError as exc:
                raise CheckFailed(f"gymnasium: {exc}") from exc
        # gymnasium's warnings are coloured "WARN: ..." texts; keep their first sentence
        seen = sorted(
            {re.sub(r"\x1b\[[0-9;]*m|WARN: ", "", str(w.message)).split(". ")[0] for w in caught}
        )
        return "passed" + (f" with warnings: {'; '.join(seen)}" if seen else "")


CHECKS = [
    ("make", "check_make"),
    ("reset", "check_reset"),
    ("step", "check_step"),
    ("seeding", "check_seeding"),
    ("tool schemas", "check_tool_schemas"),
    ("malformed actions", "check_malformed"),
    ("concurrent episodes", "check_concurrency"),
    ("JSON observations", "check_json"),
    ("gymnasium check_env", "check_gymnasium"),
]


def check(env: str | EnvFactory, *, seed: int = 0, episodes: int = 8, **kwargs: Any) -> CheckReport:
    """Run every check on env id ``env`` (made with ``kwargs``) or on a zero-argument factory.

    Each check makes fresh instances; a failing or raising check is reported, never raised.
    """
    if isinstance(env, str):
        from vime.envs.registry import make

        name = env
        factory: EnvFactory = lambda: make(name, **kwargs)  # noqa: E731
    else:
        name, factory = getattr(env, "__name__", repr(env)), env
    checker = _Checker(factory, seed, episodes)
    report = CheckReport(name)
    for label, method in CHECKS:
        try:
            report.results.append(CheckResult(label, True, getattr(checker, method)()))
        except CheckFailed as exc:
            report.results.append(CheckResult(label, False, str(exc)))
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            report.results.append(
                CheckResult(
                    label,
                    False,
                    f"raised {type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})",
                )
            )
        if label == "make" and not report.results[-1].ok:
            break  # nothing else can run without an env
    return report
