"""Fixtures for rollout tests: an env with injectable faults, the stub engine, the shared
production client (``VimeClient``) and a manager factory."""

from __future__ import annotations

import asyncio

import pytest
from stub_engine import ByteTokenizer, StubServer, counting_tool_policy

import vime
from vime.agents import AgentConfig, ChatTemplateRenderer
from vime.inference.client import VimeClient
from vime.rollout import RolloutConfig, RolloutManager


class FaultyCountingEnv(vime.ToolEnv):
    """Call ``add`` until the scripted model answers; ``task["fault"]`` injects one fault:
    ``stuck_reset`` (reset never returns), ``hang_tool`` (the tool never returns) or
    ``crash_step`` (step raises)."""

    def __init__(self) -> None:
        super().__init__(tool_timeout=0.3)
        self.fault = None
        self.calls = 0

    @vime.tool
    async def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: first addend
            b: second addend
        """
        if self.fault == "hang_tool":
            await asyncio.sleep(3600)
        self.calls += 1
        return str(a + b)

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        task = (options or {}).get("task") or {}
        self.fault = task.get("fault")
        self.calls = 0
        if self.fault == "stuck_reset":
            await asyncio.sleep(3600)
        return [{"role": "user", "content": task.get("question", "Count.")}], {}

    def answer(self, message):
        if self.fault == "crash_step":
            raise RuntimeError("the grader crashed")
        return [], float(self.calls), True, False, {}


@pytest.fixture
async def stub():
    async with StubServer(ByteTokenizer(), counting_tool_policy(turns=3)) as server:
        yield server


@pytest.fixture
async def client(stub):
    async with VimeClient(stub.url, model="stub", max_retries=0) as engine:
        yield engine


@pytest.fixture
def faulty_env_class() -> type[FaultyCountingEnv]:
    return FaultyCountingEnv


@pytest.fixture
def make_manager(client):
    def make(llm_factory=None, env_class=FaultyCountingEnv, **options) -> RolloutManager:
        options.setdefault("env_id", "test/Faulty-v0")
        return RolloutManager(
            RolloutConfig(**options),
            llm_factory or (lambda: client),
            AgentConfig(mode="tokens", max_turns=6),
            renderer=ChatTemplateRenderer(ByteTokenizer()),
            env_factory=lambda env_id: env_class(),
        )

    return make
