"""Small envs used across the env tests: a tool env with well-behaved and faulty tools, and an
async-native env."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import vime
from vime.envs.tools import tool


class CalcEnv(vime.ToolEnv):
    """Answer a sum; tools: add (works), explode (raises), nap (sleeps past its timeout)."""

    tool_timeout = 0.5

    @tool
    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first term
            b: second term
        """
        return a + b

    @tool
    def explode(self, reason: str) -> str:
        """Always fails.

        Args:
            reason: why
        """
        raise RuntimeError(f"boom: {reason}")

    @tool
    def nap(self, seconds: float) -> str:
        """Sleep for a while.

        Args:
            seconds: how long
        """
        time.sleep(seconds)
        return "rested"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.a, self.b = (int(x) for x in self.np_random.integers(0, 50, size=2))
        return [{"role": "user", "content": f"What is {self.a} + {self.b}?"}], {"a": self.a}

    def answer(self, message):
        correct = str(self.a + self.b) in (message.get("content") or "")
        return [], float(correct), True, False, {"correct": float(correct)}


class AsyncCountdown(vime.Env):
    """Async-native: count down from 3; each astep awaits briefly, terminates at zero."""

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        self.left = 3
        start = int(self.np_random.integers(0, 1000))
        return [{"role": "user", "content": f"count down from 3 (id {start})"}], {}

    async def astep(self, action):
        await asyncio.sleep(0.001)
        self.left -= 1
        content = self.parse_action(action).get("content") or ""
        return (
            [{"role": "user", "content": f"{self.left} left"}],
            1.0 if str(self.left) in content else 0.0,
            self.left == 0,
            False,
            {"left": self.left},
        )


@pytest.fixture
def calc_env_cls() -> type[CalcEnv]:
    return CalcEnv


@pytest.fixture
def async_env_cls() -> type[AsyncCountdown]:
    return AsyncCountdown


@pytest.fixture
def calc_env() -> CalcEnv:
    env = CalcEnv()
    yield env
    env.close()


@pytest.fixture
def tool_call():
    """Hermes-style tool call text: tool_call("add", a=1, b=2)."""

    def text(name: str, **arguments) -> str:
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    return text
