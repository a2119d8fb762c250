"""A lean client for vLLM's OpenAI-compatible API implementing :class:`vime.agents.LLM`:
chat with ``return_token_ids`` and token-in ``/completions``, both with per-token logprobs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from vime.errors import VimeError
from vime.types import Message


class EngineError(VimeError):
    """The engine answered with an error or without the token ids Vime needs."""


@dataclass
class EngineReply:
    """One completion as the engine sampled it."""

    text: str
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: int | None = None
    prompt_ids: list[int] = field(default_factory=list)
    message: Message | None = None


_SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "seed", "stop", "top_k", "min_p")


def sampling_body(sampling: Any) -> dict[str, Any]:
    """Request fields for ``sampling`` (a dataclass, a dict or None); None values are left out."""
    if sampling is None:
        return {}
    values = dataclasses.asdict(sampling) if dataclasses.is_dataclass(sampling) else dict(sampling)
    return {k: values[k] for k in _SAMPLING_KEYS if values.get(k) is not None}


class EngineClient:
    """Talks to one OpenAI-compatible vLLM endpoint (or a router in front of several).

    One instance is shared by all episodes (one connection pool); each call's ``session_id``
    goes out as ``X-Session-Id`` so a router keeps an episode on one engine.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str = "EMPTY",
        timeout: float = 600.0,
        max_connections: int = 1024,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self.max_connections = max_connections
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._http: Any = None  # an aiohttp session, made in the loop that first uses it

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _post(self, path: str, body: dict, session_id: str | None) -> dict:
        # aiohttp rather than httpx: httpcore's pool costs O(connections) per request, which
        # dominated the rollout loop at hundreds of concurrent episodes.
        import aiohttp

        if self._http is None:
            self._http = aiohttp.ClientSession(
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(limit=self.max_connections),
            )
        headers = {"X-Session-Id": session_id} if session_id else None
        try:
            async with self._http.post(
                self.base_url + path, json=body, headers=headers
            ) as response:
                if response.status != 200:
                    text = await response.text()
                    raise EngineError(
                        f"engine {self.base_url}{path} answered {response.status}: {text[:300]}"
                    )
                return await response.json()
        except aiohttp.ClientError as exc:
            raise EngineError(f"engine {self.base_url}{path} unreachable: {exc}") from exc

    async def chat(
        self,
        messages: list[Message],
        *,
        tools: list[dict] | None = None,
        sampling: Any = None,
        session_id: str | None = None,
    ) -> EngineReply:
        """Chat completion; the engine renders the template and reports the ids it used."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "logprobs": True,
            "return_token_ids": True,
            **sampling_body(sampling),
        }
        if tools:
            body["tools"] = tools
        data = await self._post("/chat/completions", body, session_id)
        choice = data["choices"][0]
        ids = choice.get("token_ids")
        if ids is None or data.get("prompt_token_ids") is None:
            raise EngineError(
                f"engine {self.base_url} returned no token ids: it must be vLLM (return_token_ids)"
            )
        content = (choice.get("logprobs") or {}).get("content") or []
        message = {k: v for k, v in choice["message"].items() if v not in (None, [])}
        return EngineReply(
            text=choice["message"].get("content") or "",
            completion_ids=list(ids),
            logprobs=[float(c["logprob"]) for c in content],
            finish_reason=choice.get("finish_reason") or "stop",
            weight_version=data.get("weight_version"),
            prompt_ids=list(data["prompt_token_ids"]),
            message=message,
        )

    async def generate(
        self, prompt_ids: list[int], *, sampling: Any = None, session_id: str | None = None
    ) -> EngineReply:
        """Token-in completion of ``prompt_ids``."""
        body = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "logprobs": 0,
            "return_token_ids": True,
            **sampling_body(sampling),
        }
        data = await self._post("/completions", body, session_id)
        choice = data["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise EngineError(
                f"engine {self.base_url} returned no token ids: it must be vLLM (return_token_ids)"
            )
        return EngineReply(
            text=choice.get("text") or "",
            completion_ids=list(ids),
            logprobs=[float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []],
            finish_reason=choice.get("finish_reason") or "stop",
            weight_version=data.get("weight_version"),
            prompt_ids=list(choice.get("prompt_token_ids") or prompt_ids),
        )
