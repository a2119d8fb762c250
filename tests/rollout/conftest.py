"""Fixtures for rollout tests: the stub engine, a shared engine client and a manager factory."""

from __future__ import annotations

import pytest
from fault_envs import FaultyCountingEnv
from vime.agents import AgentConfig, ChatTemplateRenderer

from vime.rollout import RolloutConfig, RolloutManager
from vime.rollout.engine_client import EngineClient
from vime.rollout.stub_server import ByteTokenizer, StubServer, counting_tool_policy


@pytest.fixture
async def stub():
    server = StubServer(ByteTokenizer(), counting_tool_policy(turns=3))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def client(stub):
    engine = EngineClient(stub.url, model="stub")
    yield engine
    await engine.aclose()


@pytest.fixture
def make_manager(client):
    def make(llm_factory=None, **options) -> RolloutManager:
        options.setdefault("env_id", "test/Faulty-v0")
        return RolloutManager(
            RolloutConfig(**options),
            llm_factory or (lambda: client),
            AgentConfig(mode="tokens", max_turns=6),
            renderer=ChatTemplateRenderer(ByteTokenizer()),
            env_factory=lambda env_id: FaultyCountingEnv(),
        )

    return make
