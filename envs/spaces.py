"""Gymnasium spaces for chat: a list of chat messages (observations) and an assistant message
(actions), each with a membership test and a seeded ``sample`` so gymnasium's checker runs."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np

from vime.types import Message

ROLES = ("system", "user", "assistant", "tool")

# Sampled texts mix words and numbers so that sampled actions sometimes parse as answers.
_WORDS = ("the", "answer", "is", "maybe", "let", "me", "think", "so", "yes", "no", "guess")


def message_problem(message: Any, roles: Sequence[str] = ROLES) -> str | None:
    """Why ``message`` is not a valid chat message with one of ``roles``, or None if it is."""
    if not isinstance(message, dict):
        return f"a message must be a dict, got {type(message).__name__}"
    role = message.get("role")
    if role not in roles:
        return f"role {role!r} is not one of {list(roles)}"
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        return (
            f"content must be a str, a list of content parts or None, got {type(content).__name__}"
        )
    if isinstance(content, list) and not all(isinstance(p, dict) for p in content):
        return "every content part must be a dict such as {'type': 'text', 'text': ...}"
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            return f"only assistant messages carry tool_calls, not {role!r} ones"
        if not isinstance(calls, list):
            return f"tool_calls must be a list, got {type(calls).__name__}"
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                return f"tool call {call!r} has no function name (OpenAI format expected)"
    return None


def _random_text(rng: np.random.Generator) -> str:
    words = [str(rng.choice(_WORDS)) for _ in range(int(rng.integers(1, 6)))]
    if rng.random() < 0.7:
        words.append(str(int(rng.integers(0, 100))))
    return " ".join(words)


class ChatMessages(gymnasium.Space[list[Message]]):
    """A list of OpenAI chat messages: what an env appends to the conversation."""

    def __init__(self, roles: Sequence[str] = ROLES, seed: int | np.random.Generator | None = None):
        self.roles = tuple(roles)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Messages have no fixed-size numeric form."""
        return False

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a list of valid messages (possibly empty)."""
        return isinstance(x, list) and all(message_problem(m, self.roles) is None for m in x)

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> list[Message]:
        """One to three random messages, reproducible through :meth:`seed`."""
        if mask is not None or probability is not None:
            raise ValueError("ChatMessages.sample takes no mask or probability")
        roles = [r for r in self.roles if r != "tool"] or list(self.roles)
        return [
            {"role": str(self.np_random.choice(roles)), "content": _random_text(self.np_random)}
            for _ in range(int(self.np_random.integers(1, 4)))
        ]

    def to_jsonable(self, sample_n: Sequence[list[Message]]) -> list[list[Message]]:
        """Messages are JSON already; copies so callers cannot alias the env's data."""
        return copy.deepcopy(list(sample_n))

    def from_jsonable(self, sample_n: list[list[Message]]) -> list[list[Message]]:
        """Inverse of :meth:`to_jsonable`."""
        return copy.deepcopy(sample_n)

    def __repr__(self) -> str:
        return f"ChatMessages(roles={list(self.roles)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChatMessages) and self.roles == other.roles


class AssistantMessage(gymnasium.Space[Message | str]):
    """An action: the model's assistant message (OpenAI ``tool_calls``) or its raw text.

    ``tool_names`` are the env's tools, so that sampled actions sometimes call them (with
    random, often invalid, arguments: the env must answer those with error observations).
    """

    def __init__(
        self, tool_names: Sequence[str] = (), seed: int | np.random.Generator | None = None
    ):
        self.tool_names = tuple(tool_names)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Messages have no fixed-size numeric form."""
        return False

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a str or a valid assistant message."""
        return isinstance(x, str) or message_problem(x, ("assistant",)) is None

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> Message:
        """A random assistant message, calling a random tool half the time when there are tools."""
        if mask is not None or probability is not None:
            raise ValueError("AssistantMessage.sample takes no mask or probability")
        rng = self.np_random
        message: Message = {"role": "assistant", "content": _random_text(rng)}
        if self.tool_names and rng.random() < 0.5:
            name = str(rng.choice(self.tool_names))
            arguments = {str(rng.choice(_WORDS)): int(rng.integers(0, 10))}
            message["tool_calls"] = [
                {
                    "id": f"call_{int(rng.integers(0, 10**6))}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ]
        return message

    def to_jsonable(self, sample_n: Sequence[Message | str]) -> list[Message | str]:
        """Actions are JSON already; copies so callers cannot alias them."""
        return copy.deepcopy(list(sample_n))

    def from_jsonable(self, sample_n: list[Message | str]) -> list[Message | str]:
        """Inverse of :meth:`to_jsonable`."""
        return copy.deepcopy(sample_n)

    def __repr__(self) -> str:
        return f"AssistantMessage(tool_names={list(self.tool_names)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AssistantMessage) and self.tool_names == other.tool_names
