"""``VimeClient``: an OpenAI-compatible client that returns exact tokens, logprobs, versions.

Built on ``openai.AsyncOpenAI`` for chat (vLLM renders the chat template and parses tool
calls) and on httpx for the token-in path (``/inference/v1/generate``). Every result holds
the prompt ids and sampled ids as the engine saw them, never re-tokenized text.

Retries happen only when the request cannot have reached an engine (the connection was
refused, or the router answered 503 with no worker); a request that was accepted and then
failed ends as :class:`RequestAborted` with a reason, so a generation never silently runs twice
on the client's account. Cancelling the awaiting task closes the connection, which makes
vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

import httpx

from vime.inference.errors import ContextTooLong, InferenceError, RequestAborted
from vime.inference.router import SESSION_HEADER
from vime.types import Message

VERSION_HEADER = "x-vime-weight-version"
ENGINE_HEADER = "x-vime-engine"
_CONTEXT_MARKERS = ("maximum context length", "max_model_len", "context length", "too long")


@dataclass
class SamplingParams:
    """Sampling options of one request (vLLM's OpenAI-compatible names)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    stop: list[str] | None = None
    n: int = 1
    logprobs: bool = True

    @classmethod
    def of(cls, value: SamplingParams | dict | None) -> SamplingParams:
        """Accept a SamplingParams, a dict of its fields, or None (defaults)."""
        if value is None:
            return cls()
        if isinstance(value, SamplingParams):
            return value
        unknown = set(value) - set(cls.__dataclass_fields__)
        if unknown:
            raise InferenceError(
                f"unknown sampling option(s) {sorted(unknown)}; known: "
                f"{sorted(cls.__dataclass_fields__)}"
            )
        return cls(**value)


@dataclass
class ChatResult:
    """One sampled assistant turn with its exact token ids."""

    text: str
    message: Message
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: int | None
    raw: Any = field(default=None, repr=False)
    engine: str | None = None  # host:port of the engine that sampled it


@dataclass
class GenerateResult:
    """One completion of the token-in path; ``weight_versions`` are vLLM's per-token spans
    ``(version, start, end)`` over ``completion_ids``."""

    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    weight_version: int | None
    weight_versions: list[tuple[int | None, int, int]] = field(default_factory=list)
    raw: Any = field(default=None, repr=False)
    engine: str | None = None


def _version(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None  # "default": an engine that Vime did not tag


def _finite(logprobs: list[float]) -> list[float]:
    # vLLM reports -inf for a token outside top-p/top-k support; keep it, but as a float.
    return [float(x) if x is not None else -math.inf for x in logprobs]


def _raise_for_finish(finish_reason: str | None, raw: object) -> None:
    if finish_reason == "abort":
        raise RequestAborted(
            "aborted_by_engine",
            "the engine aborted the generation (a weight update in abort mode, or shutdown)",
            partial=raw,
        )


def _map_status(status: int, message: str) -> InferenceError:
    if status == 400 and any(m in message.lower() for m in _CONTEXT_MARKERS):
        return ContextTooLong(f"the request does not fit the model's context: {message}")
    if status >= 500:
        return RequestAborted("server_error", f"HTTP {status}: {message[:500]}")
    return InferenceError(f"HTTP {status}: {message[:500]}")


class VimeClient:
    """Async client of a Vime router (or a single engine) at ``base_url`` (``.../v1``)."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str = "EMPTY",
        timeout: float = 600.0,
        max_retries: int = 3,
        retry_backoff: float = 0.5,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        import openai

        self.base_url = base_url.rstrip("/")
        self.root_url = self.base_url.removesuffix("/v1")
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        # Retries are ours (only where safe), never the SDK's: it would also retry 5xx
        # answers, i.e. run a generation twice.
        self._openai = openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=0,
            http_client=httpx.AsyncClient(timeout=timeout, transport=transport),
        )
        self._http = httpx.AsyncClient(
            timeout=timeout, headers={"Authorization": f"Bearer {api_key}"}, transport=transport
        )

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self._openai.close()
        await self._http.aclose()

    async def __aenter__(self) -> VimeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- retries -----------------------------------------------------------------------
    async def _call(self, fn: Any) -> Any:
        """Run ``fn()`` and retry only failures that prove the request was never served."""
        import openai

        attempt = 0
        while True:
            try:
                return await fn()
            except (openai.APIConnectionError, httpx.TransportError) as exc:
                cause = exc if isinstance(exc, httpx.TransportError) else exc.__cause__
                never_sent = isinstance(cause, httpx.ConnectError | httpx.ConnectTimeout)
                if not never_sent or attempt >= self.max_retries:
                    raise self._transport_error(exc, cause) from exc
            except openai.APIStatusError as exc:
                if exc.status_code != 503 or attempt >= self.max_retries:
                    raise _map_status(exc.status_code, _error_text(exc)) from exc
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 503 or attempt >= self.max_retries:
                    raise _map_status(exc.response.status_code, exc.response.text) from exc
            attempt += 1
            await asyncio.sleep(self.retry_backoff * 2 ** (attempt - 1))

    @staticmethod
    def _transport_error(exc: BaseException, cause: BaseException | None) -> InferenceError:
        import openai

        if isinstance(exc, openai.APITimeoutError) or isinstance(cause, httpx.TimeoutException):
            return RequestAborted("timeout", f"no answer within the request timeout ({exc!r})")
        if isinstance(cause, httpx.ConnectError | httpx.ConnectTimeout):
            return InferenceError(f"cannot connect to the inference server: {cause!r}")
        return RequestAborted(
            "connection_lost", f"the connection dropped while the request ran: {cause or exc!r}"
        )

    def _headers(self, session_id: str | None) -> dict[str, str]:
        return {SESSION_HEADER: session_id} if session_id else {}

    # -- chat --------------------------------------------------------------------------
    async def chat(
        self,
        messages: list[Message],
        *,
        tools: list[dict] | None = None,
        sampling: SamplingParams | dict | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        extra_body: dict | None = None,
    ) -> ChatResult:
        """Sample one assistant turn for ``messages`` (``sampling.n`` must be 1)."""
        params = SamplingParams.of(sampling)
        if params.n != 1:
            raise InferenceError(f"chat() samples one choice; use chat_choices() for n={params.n}")
        return (
            await self.chat_choices(
                messages,
                tools=tools,
                sampling=params,
                session_id=session_id,
                timeout=timeout,
                extra_body=extra_body,
            )
        )[0]

    async def chat_choices(
        self,
        messages: list[Message],
        *,
        tools: list[dict] | None = None,
        sampling: SamplingParams | dict | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        extra_body: dict | None = None,
    ) -> list[ChatResult]:
        """Sample ``sampling.n`` assistant turns for the same ``messages``."""
        params = SamplingParams.of(sampling)
        kwargs: dict[str, Any] = dict(
            model=self.model,
            messages=messages,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            n=params.n,
            logprobs=params.logprobs,
            extra_headers=self._headers(session_id),
            extra_body={"return_token_ids": True, **(extra_body or {})},
            timeout=timeout or self.timeout,
        )
        if params.seed is not None:
            kwargs["seed"] = params.seed
        if params.stop:
            kwargs["stop"] = params.stop
        if tools:
            kwargs["tools"] = tools

        async def request() -> Any:
            return await self._openai.chat.completions.with_raw_response.create(**kwargs)

        raw = await self._call(request)
        completion = raw.parse()
        version = _version(raw.headers.get(VERSION_HEADER))
        extra = completion.model_extra or {}
        prompt_ids = list(extra.get("prompt_token_ids") or [])
        results = []
        for choice in completion.choices:
            _raise_for_finish(choice.finish_reason, completion)
            choice_extra = choice.model_extra or {}
            ids = list(choice_extra.get("token_ids") or [])
            content = choice.logprobs.content if choice.logprobs else None
            logprobs = _finite([c.logprob for c in content or []])
            message = choice.message.model_dump(exclude_none=True)
            for key in ("refusal", "annotations", "audio", "function_call", "reasoning"):
                message.pop(key, None)
            results.append(
                ChatResult(
                    text=choice.message.content or "",
                    message=message,
                    prompt_ids=prompt_ids,
                    completion_ids=ids,
                    logprobs=logprobs,
                    finish_reason=choice.finish_reason or "",
                    weight_version=version,
                    raw=completion,
                    engine=raw.headers.get(ENGINE_HEADER),
                )
            )
        return results

    # -- token in, token out -----------------------------------------------------------
    async def generate(
        self,
        prompt_ids: list[int],
        *,
        sampling: SamplingParams | dict | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
    ) -> GenerateResult:
        """Sample a continuation of ``prompt_ids`` (no chat template is applied)."""
        if not prompt_ids:
            raise InferenceError("generate() needs at least one prompt token id")
        params = SamplingParams.of(sampling)
        if params.n != 1:
            raise InferenceError(f"generate() samples one completion, got n={params.n}")
        sp: dict[str, Any] = {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
        }
        if params.logprobs:
            sp["logprobs"] = 0
        if params.seed is not None:
            sp["seed"] = params.seed
        if params.stop:
            sp["stop"] = params.stop
        body = {
            "model": self.model,
            "token_ids": list(prompt_ids),
            "sampling_params": sp,
            "output_mode": "text",
        }

        async def request() -> httpx.Response:
            r = await self._http.post(
                f"{self.root_url}/inference/v1/generate",
                json=body,
                headers=self._headers(session_id),
                timeout=timeout or self.timeout,
            )
            r.raise_for_status()
            return r

        r = await self._call(request)
        data = r.json()
        choice = data["choices"][0]
        _raise_for_finish(choice.get("finish_reason"), data)
        content = (choice.get("logprobs") or {}).get("content") or []
        spans = [
            (_version(s.get("version")), int(s.get("start", 0)), int(s.get("end", 0)))
            for s in choice.get("weight_versions") or []
        ]
        versions = {v for v, _, _ in spans}
        version = versions.pop() if len(versions) == 1 else None
        if not spans:
            version = _version(r.headers.get(VERSION_HEADER))
        return GenerateResult(
            completion_ids=list(choice.get("token_ids") or []),
            logprobs=_finite([c["logprob"] for c in content]),
            text=choice.get("text", ""),
            finish_reason=choice.get("finish_reason") or "",
            weight_version=version,
            weight_versions=spans,
            raw=data,
            engine=r.headers.get(ENGINE_HEADER),
        )


def _error_text(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    return str(getattr(exc, "message", exc))


__all__ = ["ChatResult", "GenerateResult", "SamplingParams", "VimeClient"]
