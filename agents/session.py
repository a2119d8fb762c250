"""One episode's conversation with the engine: turns full message lists into engine calls
(token-in through a chat template, or chat through the engine's own template) and records
every turn into a :class:`TrajectoryBuilder`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from vime.agents.config import AgentConfig
from vime.agents.template import ChatTemplateRenderer
from vime.agents.trajectory import TrajectoryBuilder

from vime.errors import VimeError
from vime.types import Message


class ContextLimitReached(VimeError):
    """The next turn would not fit in the context window; the episode is truncated."""


class LLM(Protocol):
    """What an agent needs from the inference client (``vime.inference.client.VimeClient``).

    ``chat`` returns an object with ``prompt_ids``, ``completion_ids``, ``logprobs``, ``text``,
    ``message``, ``finish_reason`` and ``weight_version``; ``generate`` (token-in) the same
    without ``prompt_ids`` and ``message``.
    """

    async def chat(self, messages: list[Message], **kwargs: Any) -> Any: ...

    async def generate(self, prompt_ids: list[int], **kwargs: Any) -> Any: ...


@dataclass
class TurnRecord:
    """What one engine call produced (kept for metrics and the adapter's responses)."""

    message: Message
    text: str
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: int | None


class LLMSession:
    """Drives one episode's engine calls and keeps its token-level record.

    ``complete(messages, tools)`` takes the *whole* conversation so far, like
    ``chat.completions.create``; the session works out which messages are new since its last
    reply. In ``tokens`` mode it renders their template delta and sends ids to
    ``llm.generate``; in ``chat`` mode it sends messages to ``llm.chat`` and checks that the
    engine's prompt ids extend the ids recorded so far.
    """

    def __init__(
        self,
        llm: LLM,
        sampling: Any,
        config: AgentConfig | None = None,
        *,
        renderer: ChatTemplateRenderer | None = None,
        parse: Callable[[str], Message] | None = None,
        session_id: str | None = None,
    ) -> None:
        self.llm = llm
        self.sampling = sampling
        self.config = config or AgentConfig()
        if self.config.mode == "tokens" and renderer is None:
            raise ValueError(
                "token-in mode needs a ChatTemplateRenderer (give the agent a tokenizer), or "
                "use mode='chat' to let the engine render the chat template"
            )
        self.renderer = renderer
        self.parse = parse or _parser_from_registry(self.config.tool_parser)
        self.session_id = session_id or uuid.uuid4().hex
        self.builder = TrajectoryBuilder(self.config.drift)
        self.turns: list[TurnRecord] = []
        self._history: list[Message] = []

    @property
    def history(self) -> list[Message]:
        """The conversation as of the last reply (the caller's messages plus that reply)."""
        return list(self._history)

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[dict] | None = None
    ) -> Message:
        """Sample the assistant's next message for ``messages`` and record the turn."""
        messages = list(messages)
        if self.config.mode == "tokens":
            record = await self._complete_tokens(messages, tools)
        else:
            record = await self._complete_chat(messages, tools)
        self.turns.append(record)
        self._history = [*messages, record.message]
        return record.message

    async def _complete_tokens(
        self, messages: list[Message], tools: Sequence[dict] | None
    ) -> TurnRecord:
        renderer = self.renderer
        assert renderer is not None
        known = len(self._history)
        if not self.builder.ids:
            self.builder.extend_env(renderer.prompt_ids(messages, tools))
        elif known <= len(messages) and _same_messages(messages[:known], self._history):
            delta = renderer.delta_ids(messages[known:], self.builder.last_completion, tools)
            self.builder.extend_env(delta)
        else:
            # The caller rewrote earlier turns: the full render is the engine's true prompt.
            self.builder.observe_prompt(renderer.prompt_ids(messages, tools))
        sampling = self._fit_context(len(self.builder.ids))
        sent = list(self.builder.ids)
        result = await self.llm.generate(sent, sampling=sampling, session_id=self.session_id)
        engine_prompt = getattr(result, "prompt_ids", None)
        if engine_prompt and list(engine_prompt) != sent:
            # The engine (or something between) changed the prompt: train on what it saw.
            self.builder.observe_prompt(engine_prompt)
        self.builder.add_completion(
            result.completion_ids,
            result.logprobs,
            result.weight_version,
            getattr(result, "weight_versions", ()),
        )
        return TurnRecord(
            message=self.parse(result.text),
            text=result.text,
            completion_ids=list(result.completion_ids),
            logprobs=list(result.logprobs),
            finish_reason=result.finish_reason,
            weight_version=result.weight_version,
        )

    async def _complete_chat(
        self, messages: list[Message], tools: Sequence[dict] | None
    ) -> TurnRecord:
        sampling = self._fit_context(len(self.builder.ids))
        result = await self.llm.chat(
            messages,
            tools=list(tools) if tools else None,
            sampling=sampling,
            session_id=self.session_id,
        )
        self.builder.observe_prompt(result.prompt_ids)
        self.builder.add_completion(result.completion_ids, result.logprobs, result.weight_version)
        message = dict(result.message) if result.message else None
        if message is not None and not message.get("tool_calls"):
            # An empty list means the engine parsed no calls (or has no tool parser): leave
            # the text for the env's parser rather than assert "no calls".
            message.pop("tool_calls", None)
        if message is None or (self.config.tool_parser and not message.get("tool_calls")):
            message = self.parse(result.text)
        return TurnRecord(
            message=message,
            text=result.text,
            completion_ids=list(result.completion_ids),
            logprobs=list(result.logprobs),
            finish_reason=result.finish_reason,
            weight_version=result.weight_version,
        )

    @property
    def context_full(self) -> bool:
        """Whether the ids so far fill the context window (no further turn can be sampled)."""
        limit = self.config.max_context_tokens
        return limit is not None and len(self.builder.ids) >= limit

    def _fit_context(self, prompt_len: int) -> Any:
        """Sampling params whose max_tokens fits the context window, or ContextLimitReached."""
        limit = self.config.max_context_tokens
        if limit is None:
            return self.sampling
        room = limit - prompt_len
        if room < 1:
            raise ContextLimitReached(
                f"the prompt has {prompt_len} tokens and the context limit is {limit}"
            )
        max_tokens = _get(self.sampling, "max_tokens")
        if max_tokens is None or max_tokens <= room:
            return self.sampling
        if isinstance(self.sampling, dict):
            return {**self.sampling, "max_tokens": room}
        return replace(self.sampling, max_tokens=room)


def _get(sampling: Any, name: str) -> Any:
    if sampling is None:
        return None
    if isinstance(sampling, dict):
        return sampling.get(name)
    return getattr(sampling, name, None)


def _parser_from_registry(name: str | None) -> Callable[[str], Message]:
    """A text -> assistant message function using the named tool-call parser (or none)."""
    if name is None:
        return lambda text: {"role": "assistant", "content": text}
    from vime.tool_parsers import get_parser, to_assistant_message

    parser = get_parser(name)
    return lambda text: to_assistant_message(parser.parse(text))


def normalize_message(message: Any) -> Message:
    """A comparable plain-dict form of a chat message (SDK objects, None fields, JSON args)."""
    if hasattr(message, "model_dump"):
        message = message.model_dump(exclude_none=True)
    out: Message = {"role": message.get("role"), "content": message.get("content") or ""}
    calls = []
    for call in message.get("tool_calls") or []:
        if hasattr(call, "model_dump"):
            call = call.model_dump()
        fn = call.get("function", {})
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        calls.append((fn.get("name"), json.dumps(args, sort_keys=True)))
    if calls:
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if message.get(key):
            out[key] = message[key]
    return out


def _same_messages(a: Sequence[Message], b: Sequence[Message]) -> bool:
    return [normalize_message(m) for m in a] == [normalize_message(m) for m in b]
