"""Llama 3.x JSON tool calls: the message is ``{"name": ..., "parameters": {...}}``, optionally
after ``<|python_tag|>``, with several calls separated by ``;``."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from vime.tool_parsers.base import (
    JSON_DECODER,
    JSON_ERRORS,
    ToolCallParser,
    call_from_object,
    malformed,
    skip_space,
)
from vime.types import ToolCall

PYTHON_TAG = "<|python_tag|>"
_NAME_KEY = re.compile(r'"name"\s*:')


class Llama3JsonParser(ToolCallParser):
    """The JSON tool-call format of Llama 3.1-3.3 (``"arguments"`` is accepted for
    ``"parameters"``).

    A message holds calls when it contains ``<|python_tag|>`` (text before the tag is content)
    or when it starts with ``{`` and has a ``"name"`` key; anything else is plain content.
    After the calls, text that does not start another object is content.
    """

    name = "llama3"
    several_calls = "To make several calls, separate them with '; '."

    def _parse(
        self, text: str, string_params: Mapping[str, set[str]]
    ) -> tuple[str, list[ToolCall]]:
        tag = text.find(PYTHON_TAG)
        if tag >= 0:
            prefix, pos = text[:tag], tag + len(PYTHON_TAG)
        else:
            pos = skip_space(text, 0)
            if not text.startswith("{", pos) or not _NAME_KEY.search(text, pos):
                return text.strip(), []
            prefix = ""
        calls: list[ToolCall] = []
        while (pos := skip_space(text, pos, ";")) < len(text) and text[pos] == "{":
            try:
                obj, end = JSON_DECODER.raw_decode(text, pos)
            except JSON_ERRORS as e:
                calls.append(malformed(text[pos:].rstrip(), f"not valid JSON: {e}"))
                pos = len(text)
                break
            calls.append(call_from_object(obj, text[pos:end], ("parameters", "arguments")))
            pos = end
        if tag >= 0 and not calls:
            rest = text[pos:].strip()
            error = f"expected JSON tool calls after {PYTHON_TAG}, got {rest[:40]!r}"
            calls.append(malformed(text[tag:].strip(), error))
            pos = len(text)
        return f"{prefix.strip()}\n{text[pos:].strip()}".strip(), calls

    def render(self, calls: Sequence[ToolCall]) -> str:
        """The calls as JSON objects joined by ``; `` (no python tag, as Llama 3.1 writes them)."""
        return "; ".join(
            json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False)
            for c in calls
        )
