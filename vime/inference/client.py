"""``VimeClient``: the :class:`~vime.inference.sampling.Sampler` of Vime-served vLLM engines
(behind vllm-router, or one engine), returning exact token ids, logprobs and weight versions.

Chat goes to ``/v1/chat/completions`` with ``return_token_ids`` (vLLM renders the template
and parses tool calls); token-in goes to ``/inference/v1/generate``. The weight version
comes from the ``x-vime-weight-version`` header that Vime's engine middleware sets (and from
vLLM's per-token spans on the token-in path). Plain aiohttp and ``json``: an SDK's pydantic
parsing and httpcore's pool cost more than the whole rollout loop at a thousand episodes.

Retries happen only when no answer can come for the request: the connection was refused,
the router answered 503 (no worker: every engine is out, e.g. restarting), the router could
not reach the engine it chose (it died under the request), or the connection dropped while
the request ran (the router died under it, or the engine in direct mode; its generation
died with it). They go on with backoff for ``max_retries`` attempts or ``retry_seconds``,
whichever is longer, so a training run waits out an engine or router restart; a dropped
connection past that budget ends as :class:`RequestAborted` ("connection_lost"). A request
that an engine answered with an error, or not within the timeout, is never sent again: it
ends as :class:`RequestAborted` with a reason. Cancelling the awaiting task closes the
connection, which makes vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vime.inference.errors import ContextTooLong, InferenceError, RequestAborted
from vime.inference.router import SESSION_HEADER
from vime.inference.sampling import Sample, SamplingConfig, VersionSpan
from vime.types import Message

VERSION_HEADER = "x-vime-weight-version"
ENGINE_HEADER = "x-vime-engine"
_CONTEXT_MARKERS = ("maximum context length", "max_model_len", "context length", "too long")
_MESSAGE_EXTRAS = ("refusal", "annotations", "audio", "function_call", "reasoning")
# vllm-router's 500 when the engine it picked cannot be reached (dead, or died mid-request,
# after the router's own retries): that engine will never answer, so the request is sent again.
_ENGINE_UNREACHABLE = "error sending request for url"
_MAX_BACKOFF_S = 5.0


def _version(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None  # absent, or "default": an engine that Vime did not tag


def _logprobs(values: list[Any]) -> list[float]:
    # vLLM reports -inf (or null) for a token outside top-p/top-k support; keep it as a float.
    return [float(x) if x is not None else -math.inf for x in values]


def _check_finish(finish_reason: str | None) -> None:
    if finish_reason == "abort":
        raise RequestAborted(
            "aborted_by_engine",
            "the engine aborted the generation (a weight update in abort mode, or shutdown)",
        )


def _status_error(status: int, text: str) -> InferenceError:
    message = _error_message(text)
    if status == 400 and any(m in message.lower() for m in _CONTEXT_MARKERS):
        return ContextTooLong(f"the request does not fit the model's context: {message}")
    if status >= 500:
        return RequestAborted("server_error", f"HTTP {status}: {message[:500]}")
    return InferenceError(f"HTTP {status}: {message[:500]}")


def _no_engine_answered(status: int, text: str) -> bool:
    """The router had no engine for the request, or lost the one it chose."""
    return status == 503 or (status == 500 and _ENGINE_UNREACHABLE in text)


def _error_message(text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text
    err = body.get("error", body) if isinstance(body, dict) else body
    return str(err.get("message", err)) if isinstance(err, dict) else str(err)


class VimeClient:
    """Async sampler of a Vime router (or a single engine) at ``base_url`` (``.../v1``).

    One instance serves every episode (one connection pool); each call's ``session_id`` goes
    out as ``X-Session-Id`` so the router keeps an episode on one engine.
    """

    trainable = True

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str = "EMPTY",
        timeout: float = 600.0,
        max_retries: int = 3,
        retry_backoff: float = 0.5,
        retry_seconds: float = 0.0,
        max_connections: int = 4096,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.root_url = self.base_url.removesuffix("/v1")
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.retry_seconds = retry_seconds
        self.max_connections = max_connections
        self._auth = {"Authorization": f"Bearer {api_key}"}
        self._http: Any = None  # an aiohttp session, made in the loop that first uses it

    async def close(self) -> None:
        """Close the connection pool."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def __aenter__(self) -> VimeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- HTTP with the retry policy ----------------------------------------------------------
    async def _post(
        self, url: str, body: dict, session_id: str | None, timeout: float | None
    ) -> tuple[dict, Any]:
        """POST ``body``; return the JSON answer and the response headers."""
        import aiohttp

        if self._http is None:
            self._http = aiohttp.ClientSession(
                headers=self._auth,
                connector=aiohttp.TCPConnector(limit=self.max_connections),
            )
        headers = {SESSION_HEADER: session_id} if session_id else None
        data = json.dumps(body)
        request_timeout = aiohttp.ClientTimeout(total=timeout or self.timeout)

        async def once() -> tuple[int, str, Any]:
            async with self._http.post(
                url,
                data=data,
                headers={"Content-Type": "application/json", **(headers or {})},
                timeout=request_timeout,
            ) as r:
                return r.status, await r.text(), r.headers

        status, text, response_headers = await self._retrying(once)
        if status != 200:
            raise _status_error(status, text)
        try:
            return json.loads(text), response_headers
        except ValueError as exc:
            raise InferenceError(f"{url} answered 200 without JSON: {text[:300]!r}") from exc

    async def _retrying(
        self, once: Callable[[], Awaitable[tuple[int, str, Any]]]
    ) -> tuple[int, str, Any]:
        import aiohttp

        attempt = 0
        deadline = time.monotonic() + self.retry_seconds
        dropped = (
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError,
            aiohttp.ClientPayloadError,
        )

        def give_up() -> bool:
            return attempt >= self.max_retries and time.monotonic() >= deadline

        while True:
            try:
                status, text, headers = await once()
                if not _no_engine_answered(status, text) or give_up():
                    return status, text, headers
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                # Never reached a server: safe to send again.
                if give_up():
                    raise InferenceError(
                        f"cannot connect to the inference server: {exc!r}"
                    ) from exc
            except TimeoutError as exc:
                raise RequestAborted(
                    "timeout", f"no answer within the request timeout ({exc!r})"
                ) from exc
            except dropped as exc:
                # The process holding the request died (a router's death drops every request
                # in flight at once): no answer can come on this connection, so send it again.
                if give_up():
                    raise RequestAborted(
                        "connection_lost", f"the connection dropped while the request ran: {exc!r}"
                    ) from exc
            except aiohttp.ClientError as exc:
                raise RequestAborted("client_error", f"the request failed: {exc!r}") from exc
            attempt += 1
            await asyncio.sleep(min(_MAX_BACKOFF_S, self.retry_backoff * 2 ** (attempt - 1)))

    # -- chat --------------------------------------------------------------------------
    async def chat(
        self,
        messages: list[Message],
        *,
        tools: list[dict] | None = None,
        sampling: SamplingConfig | dict | None = None,
        session_id: str | None = None,
        seed: int | None = None,
        timeout: float | None = None,
        extra_body: dict | None = None,
    ) -> Sample:
        """Sample one assistant turn for ``messages``; the engine reports the ids it used.
        ``extra_body`` adds vLLM request fields (e.g. ``ignore_eos``)."""
        params = SamplingConfig.of(sampling)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "logprobs": True,
            "return_token_ids": True,
            **params.request_fields(seed),
            **(extra_body or {}),
        }
        if tools:
            body["tools"] = tools
        data, headers = await self._post(
            self.base_url + "/chat/completions", body, session_id, timeout
        )
        try:
            choice = data["choices"][0]
            ids = choice["token_ids"]
            prompt_ids = data["prompt_token_ids"]
        except (KeyError, IndexError, TypeError) as exc:
            raise InferenceError(
                f"{self.base_url} answered without token ids ({exc!r}): Vime's engines are vLLM "
                "(return_token_ids); for another OpenAI-compatible API use OpenAIClient"
            ) from exc
        _check_finish(choice.get("finish_reason"))
        content = (choice.get("logprobs") or {}).get("content") or []
        message = {
            k: v
            for k, v in (choice.get("message") or {}).items()
            if v is not None and k not in _MESSAGE_EXTRAS
        }
        if not message.get("tool_calls"):
            # An empty list means the engine parsed no calls (or has no tool parser).
            message.pop("tool_calls", None)
        version = _version(headers.get(VERSION_HEADER))
        return Sample(
            message=message,
            text=message.get("content") or "",
            finish_reason=choice.get("finish_reason") or "",
            prompt_ids=list(prompt_ids),
            completion_ids=list(ids),
            logprobs=_logprobs([c.get("logprob") for c in content]),
            weight_versions=[(version, 0, len(ids))] if version is not None else [],
            engine=headers.get(ENGINE_HEADER),
        )

    # -- token in, token out -----------------------------------------------------------
    async def generate(
        self,
        prompt_ids: list[int],
        *,
        sampling: SamplingConfig | dict | None = None,
        session_id: str | None = None,
        seed: int | None = None,
        timeout: float | None = None,
    ) -> Sample:
        """Sample a continuation of ``prompt_ids`` (no chat template is applied)."""
        if not prompt_ids:
            raise InferenceError("generate() needs at least one prompt token id")
        params = SamplingConfig.of(sampling)
        body = {
            "model": self.model,
            "token_ids": list(prompt_ids),
            "sampling_params": {**params.request_fields(seed), "logprobs": 0},
            "output_mode": "text",
        }
        data, headers = await self._post(
            self.root_url + "/inference/v1/generate", body, session_id, timeout
        )
        try:
            choice = data["choices"][0]
            ids = list(choice["token_ids"])
        except (KeyError, IndexError, TypeError) as exc:
            raise InferenceError(f"{self.root_url} answered without token ids ({exc!r})") from exc
        _check_finish(choice.get("finish_reason"))
        content = (choice.get("logprobs") or {}).get("content") or []
        spans: list[VersionSpan] = [
            (_version(s.get("version")), int(s.get("start", 0)), int(s.get("end", 0)))
            for s in choice.get("weight_versions") or []
        ]
        if not spans:
            version = _version(headers.get(VERSION_HEADER))
            spans = [(version, 0, len(ids))] if version is not None else []
        text = choice.get("text") or ""
        return Sample(
            message={"role": "assistant", "content": text},
            text=text,
            finish_reason=choice.get("finish_reason") or "",
            prompt_ids=list(prompt_ids),
            completion_ids=ids,
            logprobs=_logprobs([c.get("logprob") for c in content]),
            weight_versions=spans,
            engine=headers.get(ENGINE_HEADER),
        )


__all__ = ["VimeClient"]
