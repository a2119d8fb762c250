"""The sampling seam between episodes and models: one :class:`SamplingConfig`, the typed
:class:`Sample` every model call returns, and the :class:`Sampler` protocol.

Two samplers implement it: :class:`vime.inference.client.VimeClient` for Vime-served vLLM
engines (exact token ids, trainable) and :class:`vime.inference.openai_client.OpenAIClient`
for any OpenAI-compatible API (text only, not trainable).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

from vime.config.schema import option
from vime.errors import ConfigError
from vime.types import Message

# (weight version or None, start, end) over a sample's completion ids.
VersionSpan = tuple[int | None, int, int]


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample one assistant turn (vLLM's OpenAI-compatible names); the flags of
    ``vime train``, ``vime rollout`` and ``vime eval`` are generated from it."""

    temperature: float = option(1.0, help="sampling temperature (0: greedy)")
    top_p: float = option(1.0, help="nucleus sampling: keep the smallest token set of this mass")
    max_tokens: int = option(256, help="max tokens the model samples per assistant turn")
    stop: list[str] | None = option(None, help="stop strings", cli=False)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ConfigError(f"--max-tokens must be >= 1, got {self.max_tokens}")

    @classmethod
    def of(cls, value: SamplingConfig | dict | None) -> SamplingConfig:
        """Accept a SamplingConfig, a dict of its fields, or None (the defaults)."""
        if value is None:
            return cls()
        if isinstance(value, SamplingConfig):
            return value
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(value) - known
        if unknown:
            raise ConfigError(
                f"unknown sampling option(s) {sorted(unknown)}; known: {sorted(known)}"
            )
        return cls(**value)

    def request_fields(self, seed: int | None = None) -> dict[str, Any]:
        """The OpenAI-compatible request fields of these options (and a sampling seed)."""
        fields: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
        }
        if seed is not None:
            fields["seed"] = seed
        if self.stop:
            fields["stop"] = list(self.stop)
        return fields

    def replace(self, **changes: Any) -> SamplingConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass
class Sample:
    """One sampled assistant turn.

    ``prompt_ids``/``completion_ids``/``logprobs`` are the engine's own (never re-tokenized
    text); a sampler that cannot see token ids leaves them empty and sets ``trainable`` False.
    ``weight_versions`` are ``(version, start, end)`` spans over ``completion_ids``.
    """

    message: Message
    text: str
    finish_reason: str
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[VersionSpan] = field(default_factory=list)
    trainable: bool = True
    engine: str | None = None  # host:port of the engine that sampled it, when known
    attempts: int = 1  # requests it took (the OpenAI client retries failures)

    @property
    def weight_version(self) -> int | None:
        """The one weight version of every token, or None (untagged, or several)."""
        versions = {v for v, _, _ in self.weight_versions}
        return versions.pop() if len(versions) == 1 else None


class Sampler(Protocol):
    """What an episode needs from a model: one assistant turn per call.

    ``chat`` sends messages (the server renders the chat template); ``generate`` sends token
    ids (token in, token out; only engines that take ids implement it). ``trainable`` says
    whether samples carry the exact ids and logprobs a trainer needs.
    """

    trainable: bool

    async def chat(
        self,
        messages: list[Message],
        *,
        tools: list[dict] | None = None,
        sampling: SamplingConfig | None = None,
        session_id: str | None = None,
        seed: int | None = None,
    ) -> Sample: ...

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        sampling: SamplingConfig | None = None,
        session_id: str | None = None,
        seed: int | None = None,
    ) -> Sample: ...

    async def close(self) -> None: ...


__all__ = ["Sample", "Sampler", "SamplingConfig", "VersionSpan"]
