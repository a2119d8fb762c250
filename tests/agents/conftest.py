"""Fixtures for agent tests: a counting tool env, the stub vLLM-like server with its byte
tokenizer, and the production client (``VimeClient``) pointed at it."""

from __future__ import annotations

import asyncio

import pytest
from stub_engine import ByteTokenizer, StubServer, counting_tool_policy

import vime
from vime.agents import AgentConfig, ChatTemplateRenderer
from vime.inference.client import VimeClient


class CountingEnv(vime.ToolEnv):
    """Add numbers with a tool; the episode ends when the model answers without a tool call.

    Reward 1.0 when the answer names the number of tool calls made (Hermes tool calls).
    """

    def __init__(self, hang_tool: bool = False, stuck_reset: bool = False) -> None:
        super().__init__(tool_timeout=0.5)
        self.hang_tool = hang_tool
        self.stuck_reset = stuck_reset
        self.calls = 0

    @vime.tool
    async def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: first addend
            b: second addend
        """
        if self.hang_tool:
            await asyncio.sleep(3600)
        self.calls += 1
        return str(a + b)

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        if self.stuck_reset:
            await asyncio.sleep(3600)
        self.calls = 0
        task = (options or {}).get("task") or {}
        question = task.get("question", "Count with the add tool, then say the count.")
        return [
            {"role": "system", "content": "You count."},
            {"role": "user", "content": question},
        ], {}

    def answer(self, message):
        correct = str(self.calls) in (message.get("content") or "")
        return [], 1.0 if correct else 0.0, True, False, {}


@pytest.fixture
def env_cls() -> type[CountingEnv]:
    return CountingEnv


@pytest.fixture
def tokenizer() -> ByteTokenizer:
    return ByteTokenizer()


@pytest.fixture
def renderer(tokenizer) -> ChatTemplateRenderer:
    return ChatTemplateRenderer(tokenizer)


@pytest.fixture
async def stub(tokenizer):
    async with StubServer(tokenizer, counting_tool_policy(turns=5), record_requests=True) as s:
        yield s


@pytest.fixture
async def client(stub):
    async with VimeClient(stub.url, model="stub", max_retries=0) as engine:
        yield engine


@pytest.fixture
def token_config() -> AgentConfig:
    return AgentConfig(mode="tokens", max_turns=8)
