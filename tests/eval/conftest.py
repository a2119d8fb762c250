"""Fixtures for eval tests. ``StubAPI``: a faulty OpenAI-compatible chat server (aiohttp): per question it follows a
script of actions, one per attempt of a sample (the last repeats): ``right`` and ``wrong``
answers, ``verbatim`` (the answer text itself), ``429``, ``500``, ``timeout`` (answers after ``hang`` seconds), ``malformed`` (a
200 whose body is not JSON) and ``no_choices`` (JSON without ``choices``)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable

import pytest
from aiohttp import web

Script = Callable[[str], list[str]]


def default_script(question: str) -> list[str]:
    """Questions name their script: ``"... [429,right]"``; plain questions are answered right."""
    if question.endswith("]") and "[" in question:
        return question[question.rindex("[") + 1 : -1].split(",")
    return ["right"]


class StubAPI:
    """The server; ``answers`` maps a question to its right answer, ``delay`` slows every reply,
    ``requests`` counts requests per ``X-Vime-Sample`` key, ``api_keys`` holds the
    Authorization headers seen, ``seeds`` the requests' sampling seeds."""

    def __init__(
        self,
        answers: dict[str, str],
        *,
        script: Script = default_script,
        delay: float = 0.0,
        hang: float = 5.0,
    ) -> None:
        self.answers = answers
        self.script = script
        self.delay = delay
        self.hang = hang
        self.requests: Counter[str] = Counter()
        self.api_keys: set[str] = set()
        self.seeds: list[int | None] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> StubAPI:
        """Listen on a free localhost port; ``url`` is the ``.../v1`` base URL."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def stop(self) -> None:
        """Stop listening."""
        if self.runner is not None:
            await self.runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "stub", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests[request.headers.get("X-Vime-Sample", "")] += 1
        self.api_keys.add(request.headers.get("Authorization", ""))
        self.seeds.append(body.get("seed"))
        question = body["messages"][-1]["content"]
        actions = self.script(question)
        attempt = int(request.headers.get("X-Vime-Attempt", "1"))
        action = actions[min(attempt, len(actions)) - 1]
        await asyncio.sleep(self.delay)
        if action in ("429", "500"):
            return web.json_response({"error": {"message": f"stub {action}"}}, status=int(action))
        if action == "timeout":
            await asyncio.sleep(self.hang)
        if action == "malformed":
            return web.Response(text='{"choices": [', content_type="application/json")
        if action == "no_choices":
            return web.json_response({"id": "x", "object": "chat.completion"})
        answer = self.answers.get(question, "0")
        if action == "verbatim":
            text = answer
        elif action == "right":
            text = f"The answer is \\boxed{{{answer}}}."
        else:
            text = "\\boxed{-1}"
        return web.json_response(
            {
                "id": "chatcmpl-stub",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


@pytest.fixture
def task_file(tmp_path):
    """Write a Math-v0 task file from (question, answer) pairs (ids t0, t1, ...); return it."""

    def write(rows: list[tuple[str, str]], name: str = "tasks.jsonl"):
        path = tmp_path / name
        with open(path, "w") as f:
            for i, (question, answer) in enumerate(rows):
                f.write(json.dumps({"id": f"t{i}", "question": question, "answer": answer}) + "\n")
        return path

    return write


@pytest.fixture
async def stub_factory():
    """Start stub servers (``await stub_factory(answers, **options)``); stopped after the test."""
    started: list[StubAPI] = []

    async def start(answers: dict[str, str], **options) -> StubAPI:
        stub = await StubAPI(answers, **options).start()
        started.append(stub)
        return stub

    yield start
    for stub in started:
        await stub.stop()
