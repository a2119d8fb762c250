"""Hermes / Qwen tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any
number per message; the text around the blocks is the content."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from vime.tool_parsers.base import (
    JSON_ERRORS,
    ToolCallParser,
    call_from_object,
    decode_json_at,
    malformed,
    skip_space,
)
from vime.types import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(ToolCallParser):
    """The format of Hermes, Qwen2.5 and Qwen3 chat templates.

    The JSON object is decoded before looking for ``</tool_call>``, so that tag inside a JSON
    string does not cut the call. A block left open at the end of the text (output cut by
    ``max_tokens``) still counts when its JSON is complete. ``"parameters"`` is accepted for
    ``"arguments"``. A ``<tool_call>`` tag followed by neither a JSON object nor its closing
    tag is prose that mentions the tag ("without a <tool_call>", ``'<tool_call>'`` in code)
    and stays in the content, as in vLLM's parser.
    """

    name = "hermes"

    def _parse(
        self, text: str, string_params: Mapping[str, set[str]]
    ) -> tuple[str, list[ToolCall]]:
        pieces: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while (start := text.find(OPEN, pos)) >= 0:
            body = skip_space(text, start + len(OPEN))
            if not (body == len(text) or text.startswith(("{", CLOSE), body)):
                pieces.append(text[pos : start + len(OPEN)])  # a mention, not a call
                pos = start + len(OPEN)
                continue
            pieces.append(text[pos:start])
            call, pos = self._block(text, start)
            calls.append(call)
        pieces.append(text[pos:])
        return "".join(pieces).strip(), calls

    @staticmethod
    def _block(text: str, start: int) -> tuple[ToolCall, int]:
        """The call whose ``<tool_call>`` tag starts at ``start`` and the index after it."""
        body = start + len(OPEN)
        first = skip_space(text, body)
        decoded = decode_json_at(text, first) if text.startswith("{", first) else None
        if decoded is not None:
            obj, after = decoded
            tail = skip_space(text, after)
            if text.startswith(CLOSE, tail) or tail == len(text):
                end = min(tail + len(CLOSE), len(text))
                return call_from_object(obj, text[start:end], ("arguments", "parameters")), end
        close = text.find(CLOSE, body)
        end = len(text) if close < 0 else close + len(CLOSE)
        inner = text[body : close if close >= 0 else len(text)].strip()
        if not inner:
            return malformed(text[start:end], "empty <tool_call> block"), end
        try:
            obj = json.loads(inner)
        except JSON_ERRORS as e:
            return malformed(text[start:end], f"the <tool_call> block is not valid JSON ({e})"), end
        return call_from_object(obj, text[start:end], ("arguments", "parameters")), end

    def render(self, calls: Sequence[ToolCall]) -> str:
        """``<tool_call>`` blocks, one per line group, as Qwen's chat template writes them."""
        blocks = (
            json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
            for c in calls
        )
        return "\n".join(f"{OPEN}\n{block}\n{CLOSE}" for block in blocks)
