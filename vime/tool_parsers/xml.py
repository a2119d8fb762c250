"""XML-tag tool calls in the Qwen3-Coder style::

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    value
    </parameter>
    </function>
    </tool_call>

The ``<tool_call>`` wrapper is optional. Values are text: one newline after the opening tag and
one before the closing tag are dropped; a value that reads as JSON is decoded (so numbers, lists
and objects keep their type) unless the tool's schema says the parameter is a string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from vime.tool_parsers.base import JSON_ERRORS, ToolCallParser, malformed
from vime.types import ToolCall

_BLOCK = re.compile(
    r"(?:<tool_call>\s*)?<function=([^<>\n]*)>(.*?)(</function>(?:\s*</tool_call>)?|\Z)", re.DOTALL
)
_PARAM_OPEN = re.compile(r"<parameter=([^<>\n]*)>")
_PARAM_CLOSE = "</parameter>"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_STANDARD_JSON = json.JSONDecoder(parse_constant=_reject_constant)


def _loads(text: str) -> Any:
    """Standard JSON only: ``NaN``/``Infinity`` stay text."""
    return _STANDARD_JSON.decode(text)


def _is_json(text: str) -> bool:
    try:
        _loads(text)
    except JSON_ERRORS:
        return False
    return True


class XmlParser(ToolCallParser):
    """Qwen3-Coder's ``<function=NAME><parameter=ARG>value</parameter></function>`` format.

    A block must hold only ``<parameter=...>`` elements (whitespace between them is fine); stray
    text, an unclosed or duplicated parameter or an empty name makes the call malformed. A
    function left open at the end of the text still counts when its parameters are complete.
    """

    name = "xml"

    def _parse(
        self, text: str, string_params: Mapping[str, set[str]]
    ) -> tuple[str, list[ToolCall]]:
        pieces: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        for m in _BLOCK.finditer(text):
            pieces.append(text[pos : m.start()])
            name = m.group(1).strip()
            calls.append(self._call(name, m.group(2), m.group(0), string_params.get(name, set())))
            pos = m.end()
        pieces.append(text[pos:])
        return "".join(pieces).strip(), calls

    @staticmethod
    def _call(name: str, body: str, raw: str, strings: set[str]) -> ToolCall:
        if not name:
            return malformed(raw, "a <function=...> tag has no name")
        arguments: dict[str, Any] = {}
        pos = 0
        while True:
            m = _PARAM_OPEN.search(body, pos)
            gap = body[pos : m.start() if m else len(body)].strip()
            if gap:
                return malformed(
                    raw, f"unexpected text {gap[:40]!r} outside <parameter=...> tags", name
                )
            if m is None:
                return ToolCall(name, arguments, raw=raw)
            key = m.group(1).strip()
            close = body.find(_PARAM_CLOSE, m.end())
            if not key:
                return malformed(raw, "a <parameter=...> tag has no name", name)
            if close < 0:
                return malformed(raw, f"parameter {key!r} has no closing {_PARAM_CLOSE}", name)
            if key in arguments:
                return malformed(raw, f"parameter {key!r} is given twice", name)
            arguments[key] = _value(body[m.end() : close], key in strings)
            pos = close + len(_PARAM_CLOSE)

    def render(self, calls: Sequence[ToolCall]) -> str:
        """Each call in its own ``<tool_call>`` block, one parameter per element."""
        blocks = []
        for c in calls:
            params = "".join(
                f"<parameter={k}>\n{_render_value(v)}\n{_PARAM_CLOSE}\n"
                for k, v in c.arguments.items()
            )
            blocks.append(f"<tool_call>\n<function={c.name}>\n{params}</function>\n</tool_call>")
        return "\n".join(blocks)


def _value(text: str, is_string: bool) -> Any:
    text = text.removeprefix("\n").removesuffix("\n")
    try:
        value = _loads(text)
    except JSON_ERRORS:
        return text
    return value if isinstance(value, str) or not is_string else text


def _render_value(value: Any) -> str:
    # Strings that would read back as JSON, or that hold "</", are written as JSON strings;
    # "</" is escaped as "<\/" (valid JSON) so no value can close a tag early.
    if isinstance(value, str) and "</" not in value and not _is_json(value):
        return value
    return json.dumps(value, ensure_ascii=False).replace("</", "<\\/")
