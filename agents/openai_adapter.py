"""Train any agent written against the ``openai`` client: the agent gets a per-episode
``openai.AsyncOpenAI`` whose HTTP transport answers ``chat.completions`` locally through an
:class:`LLMSession`, so every call lands in the episode's token-level trajectory.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from vime.agents.config import AgentConfig
from vime.agents.session import ContextLimitReached, LLMSession
from vime.agents.template import ChatTemplateRenderer
from vime.agents.tool_agent import describe_error
from vime.inference.sampling import Sample, Sampler, SamplingConfig
from vime.types import Message, Status, Trajectory

AgentFn = Callable[[Any], Awaitable[float | None]]


class RecordingTransport(httpx.AsyncBaseTransport):
    """An httpx transport that serves ``POST .../chat/completions`` from an LLMSession.

    The rollout's sampling parameters win over the agent's (temperature, top_p, max_tokens),
    so what is trained is what the trainer asked for. Streaming is not supported.
    """

    def __init__(self, session: LLMSession, model: str = "vime") -> None:
        self.session = session
        self.model = model
        self.context_exhausted = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
            return _error(
                404,
                f"the recording client serves only POST /chat/completions, got {request.method} {request.url.path}",
            )
        body = json.loads(await request.aread() or b"{}")
        if body.get("stream"):
            return _error(
                400,
                "stream=True is not supported by Vime's recording client; call without streaming",
            )
        if (body.get("n") or 1) != 1:
            return _error(
                400, f"n={body['n']} is not supported: one episode records one completion per call"
            )
        try:
            message = await self.session.complete(body.get("messages", []), body.get("tools"))
        except ContextLimitReached as exc:
            self.context_exhausted = True
            return _error(
                400, f"maximum context length reached: {exc}", code="context_length_exceeded"
            )
        record = self.session.turns[-1]
        return httpx.Response(200, json=self._response(message, record), request=request)

    def _response(self, message: dict, record: Sample) -> dict:
        turn = len(self.session.turns)
        out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or None}
        calls = []
        for i, call in enumerate(message.get("tool_calls") or []):
            fn = call.get("function", {})
            args = fn.get("arguments", "{}")
            calls.append(
                {
                    "id": call.get("id") or f"call_{turn}_{i}",
                    "type": "function",
                    "function": {
                        "name": fn.get("name", ""),
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
        if calls:
            out["tool_calls"] = calls
        prompt_tokens = len(self.session.builder.ids) - len(record.completion_ids)
        return {
            "id": f"chatcmpl-{self.session.session_id}-{turn}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": out,
                    "finish_reason": "tool_calls" if calls else record.finish_reason or "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(record.completion_ids),
                "total_tokens": prompt_tokens + len(record.completion_ids),
            },
        }


def _error(status: int, message: str, code: str | None = None) -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"message": message, "type": "invalid_request_error", "code": code}}
    )


def recording_client(transport: RecordingTransport) -> Any:
    """An ``openai.AsyncOpenAI`` whose requests go to ``transport`` (no network, no retries)."""
    import openai

    return openai.AsyncOpenAI(
        base_url="http://vime.recording/v1",
        api_key="vime",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=transport, timeout=None),
    )


async def run_openai_agent(
    agent: AgentFn,
    llm: Sampler,
    sampling: SamplingConfig | dict | None,
    config: AgentConfig | None = None,
    *,
    renderer: ChatTemplateRenderer | None = None,
    parse: Callable[[str], Message] | None = None,
    model: str = "vime",
) -> Trajectory:
    """Run ``agent(client)`` with a recording client and return the episode's trajectory.

    ``agent`` is any coroutine function that takes an ``openai.AsyncOpenAI`` and returns the
    episode's reward (or None for 0.0). Its ``chat.completions.create`` calls are served by
    ``llm`` and recorded token by token. An exception in the agent or the engine gives a
    ``failed`` trajectory with the reason; a context overflow gives ``truncated``. Tool calls
    in the model's text are parsed by ``parse`` (default: the ``config.tool_parser`` parser).
    """
    config = config or AgentConfig()
    session = LLMSession(llm, sampling, config, renderer=renderer, parse=parse)
    transport = RecordingTransport(session, model=model)
    client = recording_client(transport)
    status, error, reward = Status.COMPLETED, None, 0.0
    try:
        result = await agent(client)
        reward = 0.0 if result is None else float(result)
    except Exception as exc:
        if transport.context_exhausted:
            status = Status.TRUNCATED
        else:
            status, error = Status.FAILED, describe_error(exc)
    finally:
        await client.close()
    if transport.context_exhausted and status is Status.COMPLETED:
        status = Status.TRUNCATED
    return session.builder.build(
        messages=session.history,
        reward=reward,
        turn_rewards=[],
        status=status,
        error=error,
        metadata={"session_id": session.session_id, "agent": getattr(agent, "__name__", "agent")},
    )
