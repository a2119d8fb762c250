"""Fixtures for agent tests: the stub vLLM-like server and its byte tokenizer, an engine client."""

from __future__ import annotations

import pytest
from vime.agents import AgentConfig, ChatTemplateRenderer

from vime.rollout.engine_client import EngineClient
from vime.rollout.stub_server import ByteTokenizer, StubServer, counting_tool_policy


@pytest.fixture
def tokenizer() -> ByteTokenizer:
    return ByteTokenizer()


@pytest.fixture
def renderer(tokenizer) -> ChatTemplateRenderer:
    return ChatTemplateRenderer(tokenizer)


@pytest.fixture
async def stub(tokenizer):
    server = StubServer(tokenizer, counting_tool_policy(turns=5))
    server.record_requests = True
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def client(stub):
    engine = EngineClient(stub.url, model="stub")
    yield engine
    await engine.aclose()


@pytest.fixture
def token_config() -> AgentConfig:
    return AgentConfig(mode="tokens", max_turns=8)
