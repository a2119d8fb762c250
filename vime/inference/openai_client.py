"""``OpenAIClient``: the :class:`~vime.inference.sampling.Sampler` of any OpenAI-compatible
chat API (a hosted model, or an engine Vime did not start). It sees text, not token ids, so
its samples are marked not trainable.

Its failure policy suits evaluation against remote endpoints: retries with exponential
backoff on 429, 5xx, timeouts, connection errors and malformed replies, a per-request timeout
and a requests-per-second limit. A request that still fails raises :class:`RequestFailed`
with a short reason that ``vime eval`` records for its sample.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from vime.inference.errors import InferenceError
from vime.inference.sampling import Sample, SamplingConfig
from vime.types import Message

# Reasons recorded in results.jsonl's ``error`` field (prefix before ": ").
RETRYABLE = ("rate_limited", "server_error", "timeout", "connection", "malformed_response")


class RequestFailed(InferenceError):
    """A chat request that failed for good; ``reason`` is one short word, ``detail`` the rest."""

    def __init__(self, reason: str, detail: str, attempts: int) -> None:
        super().__init__(f"{reason}: {detail} (after {attempts} attempt(s))")
        self.reason = reason
        self.attempts = attempts


class RateLimiter:
    """Spaces request starts at least ``1 / rate`` seconds apart (no burst)."""

    def __init__(self, rate: float | None) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        """Return when the next request may start."""
        if not self.interval:
            return
        async with self._lock:
            now = time.monotonic()
            delay = self._next - now
            self._next = max(now, self._next) + self.interval
        if delay > 0:
            await asyncio.sleep(delay)


class OpenAIClient:
    """Chat completions against ``base_url`` (``.../v1``) with the failure policy above."""

    trainable = False

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str = "EMPTY",
        timeout: float = 300.0,
        max_retries: int = 4,
        backoff: float = 1.0,
        requests_per_second: float | None = None,
    ) -> None:
        import openai

        self.model = model
        self.max_retries = max_retries
        self.backoff = backoff
        self.limiter = RateLimiter(requests_per_second)
        # The openai client's own retries are off: ours record why and share the rate limit.
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0
        )

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self._client.close()

    async def chat(
        self,
        messages: list[Message],
        *,
        tools: list[dict] | None = None,
        sampling: SamplingConfig | dict | None = None,
        session_id: str | None = None,
        seed: int | None = None,
    ) -> Sample:
        """One assistant turn for ``messages`` (not trainable); raises :class:`RequestFailed`."""
        params = SamplingConfig.of(sampling)
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            **params.request_fields(seed),
        }
        if tools:
            kwargs["tools"] = tools
        attempt = 0
        while True:
            attempt += 1
            await self.limiter.wait()
            try:
                return await self._once(kwargs, session_id or "", attempt)
            except RequestFailed as exc:
                if exc.reason not in RETRYABLE or attempt > self.max_retries:
                    raise
            # Exponential backoff, so a rate-limited endpoint gets room to recover.
            await asyncio.sleep(self.backoff * 2 ** (attempt - 1))

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        sampling: SamplingConfig | dict | None = None,
        session_id: str | None = None,
        seed: int | None = None,
    ) -> Sample:
        """Not available: an OpenAI-compatible API takes messages, not token ids."""
        raise InferenceError(
            "OpenAIClient cannot sample from token ids; play the episode in chat mode "
            "(--agent-mode chat), or serve the model with Vime for token-in sampling"
        )

    async def _once(self, kwargs: dict[str, Any], session_id: str, attempt: int) -> Sample:
        import openai

        # The headers let server logs (and test stubs) tell samples and their retries apart.
        headers = {"X-Vime-Sample": session_id, "X-Vime-Attempt": str(attempt)}
        try:
            response = await self._client.chat.completions.create(**kwargs, extra_headers=headers)
        except openai.RateLimitError as exc:
            raise RequestFailed("rate_limited", _short(exc), attempt) from None
        except openai.APITimeoutError as exc:
            raise RequestFailed("timeout", _short(exc), attempt) from None
        except openai.APIConnectionError as exc:
            raise RequestFailed("connection", _short(exc), attempt) from None
        except openai.APIStatusError as exc:
            reason = "server_error" if exc.status_code >= 500 else "client_error"
            raise RequestFailed(reason, f"HTTP {exc.status_code}: {_short(exc)}", attempt) from None
        except (openai.APIResponseValidationError, ValueError) as exc:
            raise RequestFailed("malformed_response", _short(exc), attempt) from None
        return _sample(response, attempt)


def _sample(response: Any, attempt: int) -> Sample:
    try:
        choice = response.choices[0]
        message = choice.message.model_dump(exclude_none=True)
    except (AttributeError, IndexError, TypeError) as exc:
        raise RequestFailed(
            "malformed_response",
            f"no choices[0].message in {str(response)[:200]!r} ({exc})",
            attempt,
        ) from None
    message = {k: v for k, v in message.items() if k in ("content", "tool_calls")}
    message["role"] = "assistant"
    if not message.get("tool_calls"):
        message.pop("tool_calls", None)
    return Sample(
        message=message,
        text=message.get("content") or "",
        finish_reason=str(choice.finish_reason or ""),
        trainable=False,
        attempts=attempt,
    )


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:300]


__all__ = ["OpenAIClient", "RateLimiter", "RequestFailed"]
