"""Test support: a zero-latency server that answers like a Vime-served vLLM engine, from a
deterministic script, for the fast tests and the rollout benchmark.

It speaks only what the real engines speak: chat completions with ``return_token_ids``
(``prompt_token_ids`` and per-choice ``token_ids``, per-token logprobs), vLLM's token-in
``/inference/v1/generate``, ``/v1/models``, and the weight version in the
``x-vime-weight-version`` response header that Vime's engine middleware sets.

It renders chat requests with any tokenizer that has ``apply_chat_template`` and ``encode``;
:class:`ByteTokenizer` is a dependency-free one (bytes plus ChatML special tokens).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


class ByteTokenizer:
    """One id per UTF-8 byte (0-255) plus ChatML special tokens; renders Qwen-style ChatML
    with Hermes ``<tool_call>`` tools. Re-tokenisation is exact, so it never drifts by itself."""

    eos_token = "<|im_end|>"

    def __init__(self) -> None:
        self.special_ids = {s: 256 + i for i, s in enumerate(SPECIALS)}
        self.id_to_special = {i: s for s, i in self.special_ids.items()}
        self.eos_token_id = self.special_ids[self.eos_token]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text``; special-token strings become their single ids."""
        ids: list[int] = []
        for part in _SPECIAL_RE.split(text):
            if part in self.special_ids:
                ids.append(self.special_ids[part])
            elif part:
                ids.extend(part.encode())
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (invalid UTF-8 is replaced)."""
        out, buf = [], bytearray()
        for i in ids:
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode(errors="replace"))
            buf = bytearray()
            if not skip_special_tokens:
                # ids of another vocabulary (a client with a real tokenizer) show as U+FFFD
                out.append(self.id_to_special.get(i, "\ufffd"))
        out.append(buf.decode(errors="replace"))
        return "".join(out)

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **_: Any,
    ) -> str | list[int]:
        """ChatML text (or ids with ``tokenize=True``) of ``messages``."""
        parts = []
        if tools:
            system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
            listing = "\n".join(json.dumps(t, sort_keys=True) for t in tools)
            parts.append(f"<|im_start|>system\n{system}\n<tools>\n{listing}\n</tools><|im_end|>\n")
            if messages and messages[0]["role"] == "system":
                messages = messages[1:]
        for m in messages:
            content = m.get("content") or ""
            if m["role"] == "assistant":
                # Qwen2.5's layout: a sampled "<tool_call>..." right after the generation
                # prompt re-renders to the same text.
                text = f"\n{content}" if content else ""
                for call in m.get("tool_calls") or []:
                    fn = call["function"]
                    args = fn["arguments"]
                    args = json.loads(args) if isinstance(args, str) else args
                    call_json = json.dumps({"name": fn["name"], "arguments": args})
                    text += f"\n<tool_call>\n{call_json}\n</tool_call>"
                parts.append(f"<|im_start|>assistant{text}<|im_end|>\n")
            elif m["role"] == "tool":
                parts.append(
                    f"<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n"
                )
            else:
                parts.append(f"<|im_start|>{m['role']}\n{content}<|im_end|>\n")
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        text = "".join(parts)
        return self.encode(text) if tokenize else text


Policy = Callable[[str], str]


def counting_tool_policy(turns: int = 5, tool: str = "add") -> Policy:
    """A scripted model: calls ``tool`` until it has answered ``turns - 1`` times, then answers.

    The reply depends only on the prompt text, so episodes are reproducible.
    """

    def policy(prompt: str) -> str:
        done = prompt.count("<|im_start|>assistant") - 1
        if done < turns - 1:
            args = {"a": done, "b": 1}
            return (
                f'<tool_call>\n{{"name": "{tool}", "arguments": {json.dumps(args)}}}\n</tool_call>'
            )
        return f"The answer is {done}."

    return policy


def stub_logprob(token_id: int, position: int) -> float:
    """The stub's deterministic 'logprob' of ``token_id`` sampled at ``position``."""
    return -(((token_id * 7 + position * 13) % 50) + 1) / 100.0


# ``fault(path, body)`` may answer a request itself: an aiohttp response, or DROP to close the
# connection without an answer (an engine that died mid-request); None lets the stub answer.
Fault = Callable[[str, dict], Any]
DROP = "drop"


class StubServer:
    """An aiohttp app serving ``/v1/chat/completions``, ``/inference/v1/generate`` and
    ``/v1/models``. ``policy(prompt_text) -> reply_text`` decides every answer; the reply is
    followed by the tokenizer's EOS id unless it hits ``max_tokens``. ``weight_version`` goes
    out in the ``x-vime-weight-version`` header, as Vime's engine middleware sends it.
    ``delay`` (seconds, or a function of the prompt text) simulates generation time. With
    ``parse_tool_calls`` chat answers carry Hermes ``<tool_call>`` blocks as OpenAI
    ``tool_calls``, like vLLM's ``--tool-call-parser hermes``. ``fault`` injects failures.
    """

    def __init__(
        self,
        tokenizer: Any | None = None,
        policy: Policy | None = None,
        *,
        model: str = "stub",
        weight_version: int = 0,
        delay: float | Callable[[str], float] = 0.0,
        parse_tool_calls: bool = False,
        record_requests: bool = False,
        fault: Fault | None = None,
    ) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()
        self.policy = policy or counting_tool_policy()
        self.model = model
        self.weight_version = weight_version
        self.delay = delay
        self.parse_tool_calls = parse_tool_calls
        self.requests: list[dict] = []
        self.record_requests = record_requests
        self.fault = fault
        self.headers: list[dict[str, str]] = []  # of every request, when recording
        self.in_flight = 0
        self.max_in_flight = 0
        self.url = ""
        self._runner: Any = None

    def _message(self, reply: str) -> dict:
        """The assistant message of ``reply`` (tool calls split out when parsing is on)."""
        if not self.parse_tool_calls:
            return {"role": "assistant", "content": reply, "tool_calls": []}
        calls = []
        for i, body in enumerate(_CALL_RE.findall(reply)):
            call = json.loads(body)
            arguments = json.dumps(call.get("arguments", {}))
            calls.append(
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": call.get("name", ""), "arguments": arguments},
                }
            )
        content = _CALL_RE.sub("", reply).strip() if calls else reply
        return {"role": "assistant", "content": content or None, "tool_calls": calls}

    async def _wait(self, prompt: str) -> None:
        """Hold the request for the configured delay, counting requests in flight."""
        delay = self.delay(prompt) if callable(self.delay) else self.delay
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if delay:
                await asyncio.sleep(delay)
        finally:
            self.in_flight -= 1

    def _complete(
        self, prompt_ids: list[int], max_tokens: int | None
    ) -> tuple[list[int], str, str]:
        reply = self.policy(self.tokenizer.decode(prompt_ids))
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.tokenizer.eos_token_id]
        finish = "stop"
        if max_tokens is not None and len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return ids, text, finish

    async def _faults(self, request: Any, handler: Callable) -> Any:
        """aiohttp middleware: record the request, then let ``fault`` answer it if it will."""
        if self.record_requests:
            self.headers.append(dict(request.headers))
        if self.fault is not None and request.method == "POST":
            answer = self.fault(request.path, await request.json())
            if answer == DROP:
                request.transport.close()
                await asyncio.sleep(3600)  # the client sees the connection go
            if answer is not None:
                return answer
        return await handler(request)

    async def _chat(self, request: Any) -> Any:
        body = await request.json()
        if self.record_requests:
            self.requests.append(body)
        text = self.tokenizer.apply_chat_template(
            body["messages"], tools=body.get("tools"), tokenize=False, add_generation_prompt=True
        )
        prompt_ids = self.tokenizer.encode(text, add_special_tokens=False)
        version = self.weight_version  # the weights the request started under
        await self._wait(text)
        ids, reply, finish = self._complete(prompt_ids, body.get("max_tokens"))
        start = len(prompt_ids)
        logprobs = [
            {
                "token": f"token_id:{t}",
                "logprob": stub_logprob(t, start + i),
                "bytes": None,
                "top_logprobs": [],
            }
            for i, t in enumerate(ids)
        ]
        message = self._message(reply)
        if body.get("stream"):
            return await self._stream(request, message, finish, version)
        choice = {
            "message": message,
            "logprobs": {"content": logprobs},
            "finish_reason": finish,
            "token_ids": ids,
        }
        return self._openai_response(
            "chat.completion", choice, prompt_ids, ids, version, prompt_token_ids=prompt_ids
        )

    async def _stream(self, request: Any, message: dict, finish: str, version: int) -> Any:
        """A streamed chat answer (``stream=True``), as server-sent events: the whole reply in
        one delta, then the finish reason and ``[DONE]``."""
        from aiohttp import web

        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "x-vime-weight-version": str(version)}
        )
        await response.prepare(request)
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        envelope = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion.chunk"}
        envelope.update(created=int(time.time()), model=self.model)
        chunks = [
            {**envelope, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {**envelope, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        ]
        for chunk in chunks:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _openai_response(
        self,
        kind: str,
        choice: dict[str, Any],
        prompt_ids: list[int],
        ids: list[int],
        version: int,
        **extra: Any,
    ) -> Any:
        """The OpenAI envelope (id, usage, weight version header) around one choice."""
        from aiohttp import web

        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        body = {
            "id": f"{prefix}-{len(self.requests)}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, **choice}],
            **extra,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt_ids) + len(ids),
            },
        }
        return web.json_response(body, headers={"x-vime-weight-version": str(version)})

    async def _generate(self, request: Any) -> Any:
        """vLLM's token-in ``/inference/v1/generate``."""
        from aiohttp import web

        body = await request.json()
        if self.record_requests:
            self.requests.append(body)
        prompt_ids = list(body["token_ids"])
        version = self.weight_version
        if self.delay:
            await self._wait(self.tokenizer.decode(prompt_ids))
        ids, reply, finish = self._complete(
            prompt_ids, body.get("sampling_params", {}).get("max_tokens")
        )
        start = len(prompt_ids)
        content = [{"logprob": stub_logprob(t, start + i)} for i, t in enumerate(ids)]
        return web.json_response(
            {
                "choices": [
                    {
                        "index": 0,
                        "token_ids": ids,
                        "text": reply,
                        "finish_reason": finish,
                        "logprobs": {"content": content},
                    }
                ]
            },
            headers={"x-vime-weight-version": str(version)},
        )

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        )

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port`` (0 picks a free port) in the running loop; return the base URL."""
        from aiohttp import web

        @web.middleware
        async def faults(request: Any, handler: Callable) -> Any:
            return await self._faults(request, handler)

        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[faults])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/inference/v1/generate", self._generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", lambda r: web.Response(text="ok"))
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=4096)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.url = f"http://{host}:{sock.getsockname()[1]}/v1"
        return self.url

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> StubServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def main(argv: list[str] | None = None) -> None:
    """``python tests/support/stub_engine.py [--port P] [--turns N] [--delay S]``: serve until
    killed, printing ``READY <base_url>`` once listening."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--turns", type=int, default=5, help="assistant turns per scripted episode")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each answer takes")
    parser.add_argument(
        "--parse-tool-calls", action="store_true", help="answer chat tool calls as tool_calls"
    )
    args = parser.parse_args(argv)

    async def serve() -> None:
        server = StubServer(
            policy=counting_tool_policy(args.turns),
            delay=args.delay,
            parse_tool_calls=args.parse_tool_calls,
        )
        print(f"READY {await server.start(args.host, args.port)}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
