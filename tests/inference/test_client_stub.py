"""``VimeClient`` (the production sampler of Vime's engines) against the stub engine: what it
sends, what it reads back, and its retry and error policy under injected faults."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web
from stub_engine import DROP, ByteTokenizer, StubServer, stub_logprob

from vime.errors import ConfigError
from vime.inference.client import VimeClient
from vime.inference.errors import ContextTooLong, InferenceError, RequestAborted
from vime.inference.sampling import SamplingConfig

HELLO = [{"role": "user", "content": "x"}]


def reply(text: str):
    return lambda prompt: text


@pytest.fixture
async def stub():
    async with StubServer(policy=reply("hi"), record_requests=True) as server:
        yield server


async def test_chat_returns_the_engines_ids_logprobs_and_header_version(stub):
    stub.weight_version = 4
    async with VimeClient(stub.url, model="stub") as client:
        sample = await client.chat(HELLO, session_id="s-1", seed=3)

    tok = ByteTokenizer()
    prompt = tok.encode(tok.apply_chat_template(HELLO, add_generation_prompt=True))
    completion = [*tok.encode("hi"), tok.eos_token_id]
    assert (sample.prompt_ids, sample.completion_ids) == (prompt, completion)
    assert sample.logprobs == [stub_logprob(t, len(prompt) + i) for i, t in enumerate(completion)]
    assert (sample.text, sample.finish_reason, sample.weight_version) == ("hi", "stop", 4)
    assert sample.weight_versions == [(4, 0, len(completion))]
    assert sample.message == {"role": "assistant", "content": "hi"} and sample.trainable
    body, headers = stub.requests[0], stub.headers[0]
    assert headers["X-Session-Id"] == "s-1"
    assert body["return_token_ids"] is True and body["logprobs"] is True and body["seed"] == 3


async def test_generate_sends_ids_and_sampling_and_reads_the_header_version(stub):
    stub.weight_version = 2
    async with VimeClient(stub.url, model="stub") as client:
        sample = await client.generate([104, 105], sampling=SamplingConfig(max_tokens=1))

    assert stub.requests[0]["token_ids"] == [104, 105]
    assert stub.requests[0]["sampling_params"]["max_tokens"] == 1
    assert sample.completion_ids == [ord("h")] and sample.finish_reason == "length"
    assert sample.prompt_ids == [104, 105] and sample.weight_version == 2


async def test_generate_prefers_vllms_per_token_version_spans():
    def spans(path: str, body: dict):
        choice = {
            "index": 0, "text": "ab", "finish_reason": "length", "token_ids": [5, 6],
            "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}]},
            "weight_versions": [{"version": "3", "start": 0, "end": 1},
                                {"version": "4", "start": 1, "end": 2}],
        }  # fmt: skip
        return web.json_response({"choices": [choice]}, headers={"x-vime-weight-version": "4"})

    async with StubServer(fault=spans) as stub, VimeClient(stub.url, model="stub") as client:
        sample = await client.generate([1, 2])
    assert (sample.completion_ids, sample.logprobs) == ([5, 6], [-1.0, -2.0])
    assert sample.weight_versions == [(3, 0, 1), (4, 1, 2)] and sample.weight_version is None


async def test_refused_connections_are_retried_until_the_engine_is_up():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = VimeClient(f"http://127.0.0.1:{port}/v1", model="stub", retry_backoff=0.2)
    server = StubServer(policy=reply("hi"))
    call = asyncio.ensure_future(client.chat(HELLO))
    await asyncio.sleep(0.1)
    await server.start(port=port)
    try:
        sample = await asyncio.wait_for(call, 10)
    finally:
        await client.close()
        await server.stop()
    assert sample.text == "hi"


class CountingFault:
    """A stub fault that answers ``response()`` while ``failing(calls)`` holds (then lets the
    policy answer) and counts the requests it saw."""

    def __init__(self, response, failing=lambda calls: True) -> None:
        self.response, self.failing, self.calls = response, failing, 0

    def __call__(self, path: str, body: dict):
        self.calls += 1
        return self.response() if self.failing(self.calls) else None


def no_workers():
    return web.json_response({"error": "No available workers"}, status=503)


async def test_a_router_without_workers_is_retried_then_reported():
    fault = CountingFault(no_workers)
    async with StubServer(fault=fault) as stub:
        client = VimeClient(stub.url, model="stub", max_retries=2, retry_backoff=0.0)
        with pytest.raises(RequestAborted, match="HTTP 503") as info:
            await client.chat(HELLO)
        await client.close()
    assert fault.calls == 3 and info.value.reason == "server_error"


async def test_an_engine_lost_by_the_router_is_retried_until_one_answers():
    # vllm-router's 500 when its engine died under the request (measured against the real
    # router with a worker killed mid-request); a restarted engine answers the retry.
    text = "Request failed: error sending request for url (http://127.0.0.1:1/v1/chat)"
    fault = CountingFault(lambda: web.Response(text=text, status=500), lambda calls: calls <= 2)
    async with StubServer(policy=reply("back"), fault=fault) as stub:
        client = VimeClient(stub.url, model="stub", retry_backoff=0.0)
        sample = await client.chat(HELLO)
        await client.close()
    assert sample.text == "back" and fault.calls == 3


async def test_retry_seconds_waits_out_an_engine_restart_past_max_retries():
    # A training run's client: every engine out (the router answers 503) for 1.5 s, longer
    # than max_retries attempts take, and the request still gets its answer.
    loop = asyncio.get_running_loop()
    restarted_at = loop.time() + 1.5
    fault = CountingFault(no_workers, lambda calls: loop.time() < restarted_at)
    async with StubServer(policy=reply("back"), fault=fault) as stub:
        client = VimeClient(
            stub.url, model="stub", max_retries=1, retry_backoff=0.1, retry_seconds=30
        )
        sample = await client.chat(HELLO)
        await client.close()
    assert sample.text == "back" and fault.calls > 2


async def test_retry_seconds_is_a_bound_then_the_request_is_reported():
    fault = CountingFault(no_workers)
    async with StubServer(fault=fault) as stub:
        client = VimeClient(
            stub.url, model="stub", max_retries=0, retry_backoff=0.05, retry_seconds=0.5
        )
        start = asyncio.get_running_loop().time()
        with pytest.raises(RequestAborted, match="HTTP 503"):
            await client.chat(HELLO)
        waited = asyncio.get_running_loop().time() - start
        await client.close()
    assert 0.5 <= waited < 3.0 and fault.calls > 2


async def test_a_request_whose_connection_dropped_is_sent_again():
    # The router killed under a request closes its connection with no answer (CI's router
    # kill -9 landed mid-rollout and failed every episode of the step); the restarted router
    # answers the retry.
    fault = CountingFault(lambda: DROP, lambda calls: calls <= 2)
    async with StubServer(policy=reply("back"), fault=fault) as stub:
        client = VimeClient(stub.url, model="stub", retry_backoff=0.0)
        sample = await client.chat(HELLO)
        await client.close()
    assert sample.text == "back" and fault.calls == 3


async def test_a_connection_that_keeps_dropping_is_reported_after_the_retries():
    fault = CountingFault(lambda: DROP)
    async with StubServer(fault=fault) as stub:
        client = VimeClient(stub.url, model="stub", max_retries=2, retry_backoff=0.0)
        with pytest.raises(RequestAborted, match="the connection dropped") as info:
            await client.chat(HELLO)
        await client.close()
    assert fault.calls == 3 and info.value.reason == "connection_lost"


@pytest.mark.parametrize(
    ("status", "message", "error", "reason"),
    [
        (400, "This model's maximum context length is 64 tokens.", ContextTooLong, None),
        (500, "EngineCore died", RequestAborted, "server_error"),
        (404, "model nope not found", InferenceError, None),
    ],
)
async def test_http_errors_become_typed_errors(status, message, error, reason):
    def failing(path: str, body: dict):
        return web.json_response({"error": {"message": message}}, status=status)

    async with StubServer(fault=failing) as stub, VimeClient(stub.url, model="stub") as client:
        with pytest.raises(error) as info:
            await client.chat(HELLO)
    assert message in str(info.value)
    if reason:
        assert info.value.reason == reason


async def test_an_engine_abort_is_reported_as_an_aborted_request():
    def aborting(path: str, body: dict):
        choice = {"index": 0, "text": "", "finish_reason": "abort", "token_ids": []}
        return web.json_response({"choices": [choice]})

    async with StubServer(fault=aborting) as stub, VimeClient(stub.url, model="stub") as client:
        with pytest.raises(RequestAborted) as info:
            await client.generate([1])
    assert info.value.reason == "aborted_by_engine"


async def test_an_answer_without_token_ids_names_the_other_client():
    def plain(path: str, body: dict):
        choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}}
        return web.json_response({"choices": [choice]})

    async with StubServer(fault=plain) as stub, VimeClient(stub.url, model="stub") as client:
        with pytest.raises(InferenceError, match=r"without token ids.*OpenAIClient"):
            await client.chat(HELLO)


async def test_a_request_timeout_aborts_the_request():
    async with (
        StubServer(policy=reply("hi"), delay=5.0) as stub,
        VimeClient(stub.url, model="stub", timeout=0.3) as client,
    ):
        with pytest.raises(RequestAborted) as info:
            await client.chat(HELLO)
    assert info.value.reason == "timeout"


def test_sampling_config_rejects_unknown_and_bad_options():
    assert SamplingConfig.of({"temperature": 0.0}).temperature == 0.0
    with pytest.raises(ConfigError, match=r"unknown sampling option\(s\) \['temprature'\]"):
        SamplingConfig.of({"temprature": 0.0})
    with pytest.raises(ConfigError, match=r"--top-p must be in \(0, 1\], got 0"):
        SamplingConfig(top_p=0)
