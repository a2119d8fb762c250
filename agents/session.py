"""One episode's conversation with the engine: turns full message lists into engine calls
(token-in through a chat template, or chat through the engine's own template) and records
every turn into a :class:`TrajectoryBuilder`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from vime.agents.config import AgentConfig
from vime.agents.template import ChatTemplateRenderer
from vime.agents.trajectory import TrajectoryBuilder
from vime.errors import VimeError
from vime.inference.sampling import Sample, Sampler, SamplingConfig
from vime.types import Message


class ContextLimitReached(VimeError):
    """The next turn would not fit in the context window; the episode is truncated."""


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
        llm: Sampler,
        sampling: SamplingConfig | dict | None,
        config: AgentConfig | None = None,
        *,
        renderer: ChatTemplateRenderer | None = None,
        parse: Callable[[str], Message] | None = None,
        session_id: str | None = None,
        seed: int | None = None,
    ) -> None:
        self.llm = llm
        self.sampling = SamplingConfig.of(sampling)
        self.seed = seed  # the sampling seed of every request (None: the engine's own)
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
        self.turns: list[Sample] = []  # every sample, its message parsed
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
    ) -> Sample:
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
        sample = await self.llm.generate(
            list(self.builder.ids), sampling=sampling, session_id=self.session_id, seed=self.seed
        )
        self._record(sample)
        return replace(sample, message=self.parse(sample.text))

    async def _complete_chat(self, messages: list[Message], tools: Sequence[dict] | None) -> Sample:
        sampling = self._fit_context(len(self.builder.ids))
        sample = await self.llm.chat(
            messages,
            tools=list(tools) if tools else None,
            sampling=sampling,
            session_id=self.session_id,
            seed=self.seed,
        )
        self._record(sample)
        message = dict(sample.message)
        if not message.get("tool_calls"):
            # No parsed calls (or no tool parser on the server): leave the text for the
            # env's parser rather than assert "no calls".
            message.pop("tool_calls", None)
            if self.config.tool_parser:
                message = self.parse(sample.text)
        return replace(sample, message=message)

    def _record(self, sample: Sample) -> None:
        """Add the sample's ids to the trajectory (a text-only sample adds a turn only)."""
        if not sample.trainable:
            self.builder.add_untracked_turn()
            return
        if sample.prompt_ids and sample.prompt_ids != self.builder.ids:
            # Chat mode, or something between changed the prompt: train on what it saw.
            self.builder.observe_prompt(sample.prompt_ids)
        self.builder.add_completion(
            sample.completion_ids, sample.logprobs, sample.weight_version, sample.weight_versions
        )

    @property
    def context_full(self) -> bool:
        """Whether the ids so far fill the context window (no further turn can be sampled)."""
        limit = self.config.max_context_tokens
        return limit is not None and len(self.builder.ids) >= limit

    def _fit_context(self, prompt_len: int) -> SamplingConfig:
        """Sampling whose max_tokens fits the context window, or ContextLimitReached."""
        limit = self.config.max_context_tokens
        if limit is None:
            return self.sampling
        room = limit - prompt_len
        if room < 1:
            raise ContextLimitReached(
                f"the prompt has {prompt_len} tokens and the context limit is {limit}"
            )
        if self.sampling.max_tokens <= room:
            return self.sampling
        return self.sampling.replace(max_tokens=room)


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
