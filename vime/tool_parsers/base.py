"""The tool-call parser interface: the text a model wrote becomes content plus ToolCalls, each
``ok`` or ``malformed``, and parsing never raises."""

from __future__ import annotations

import abc
import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vime.types import Message, ToolCall

log = logging.getLogger(__name__)

JSON_DECODER = json.JSONDecoder()
# What decoding model-written JSON can raise: bad syntax, or nesting deeper than the C decoder's
# recursion limit (a few thousand brackets).
JSON_ERRORS = (ValueError, RecursionError)


@dataclasses.dataclass(frozen=True)
class ParseResult:
    """What a parser found: the text outside tool calls, the calls in order, and the input."""

    content: str
    calls: list[ToolCall]
    raw: str

    @property
    def num_malformed(self) -> int:
        """How many calls could not be parsed."""
        return sum(c.status == "malformed" for c in self.calls)


class ToolCallParser(abc.ABC):
    """Reads one model family's tool-call syntax; subclasses implement ``_parse`` and ``render``.

    ``parse`` never raises. Call ids are ``call_0``, ``call_1``, ... in order within a message,
    so the same text always gives the same trajectory. A leading reasoning block in
    ``reasoning_tags`` (``<think>...</think>``; an unclosed one runs to the end) is content: a
    model thinking about a call has not made it. When the chat template itself opens the block,
    the text has only ``</think>``; strip the reasoning before parsing (vLLM's reasoning parser
    does), since a ``</think>`` alone cannot be told from one inside a call's arguments.
    """

    name: str = ""
    several_calls = "You may make several calls in one reply."
    reasoning_tags: tuple[str, str] | None = ("<think>", "</think>")

    def parse(self, text: str | None, *, tools: Iterable[Any] | None = None) -> ParseResult:
        """Split ``text`` into content and tool calls.

        ``tools`` (OpenAI tool schemas or objects with a ``.schema``) is optional; formats whose
        argument values are untyped text use it to keep string parameters as strings.
        """
        text = "" if text is None else str(text)
        strings = string_parameters(tools)
        contents: list[str] = []
        calls: list[ToolCall] = []
        try:
            for is_reasoning, segment in self._segments(text):
                content, found = (segment, []) if is_reasoning else self._parse(segment, strings)
                contents.append(content.strip())
                calls += found
        except Exception:  # a parser bug must not end a rollout; the text is kept as content
            log.warning(
                "tool-call parser %r failed; keeping the text as content", self.name, exc_info=True
            )
            return ParseResult(text.strip(), [], text)
        calls = [dataclasses.replace(c, id=f"call_{i}") for i, c in enumerate(calls)]
        return ParseResult("\n\n".join(c for c in contents if c), calls, text)

    def _segments(self, text: str) -> list[tuple[bool, str]]:
        """``text`` cut into its leading reasoning (if any) and the rest: (is_reasoning, piece)."""
        if self.reasoning_tags is None or not text.lstrip().startswith(self.reasoning_tags[0]):
            return [(False, text)]
        end = text.find(self.reasoning_tags[1])
        end = len(text) if end < 0 else end + len(self.reasoning_tags[1])
        return [(True, text[:end]), (False, text[end:])]

    @abc.abstractmethod
    def _parse(
        self, text: str, string_params: Mapping[str, set[str]]
    ) -> tuple[str, list[ToolCall]]:
        """Return (content, calls) for ``text``; ids are assigned by ``parse``."""

    @abc.abstractmethod
    def render(self, calls: Sequence[ToolCall]) -> str:
        """Write ``calls`` (name and arguments) the way this model family emits them."""

    def instructions(self, tools: Iterable[Any]) -> str:
        """A system-prompt section for models whose chat template cannot show ``tools``: their
        schemas and an example call in this format (empty when there are no tools)."""
        functions = function_schemas(tools)
        if not functions:
            return ""
        listing = "\n".join(
            json.dumps({"type": "function", "function": f}, ensure_ascii=False) for f in functions
        )
        first = functions[0]
        example = self.render([ToolCall(first["name"], example_arguments(first))])
        return (
            f"You can call these tools, described by JSON Schema:\n<tools>\n{listing}\n</tools>\n\n"
            f"To call a tool, write the call in exactly this format (example values shown):\n"
            f"{example}\n\n{self.several_calls} Each result comes back to you in a tool message."
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def function_schemas(tools: Iterable[Any] | None) -> list[dict[str, Any]]:
    """The ``function`` part of each tool (OpenAI tool schemas, or objects with ``.schema``)."""
    found = []
    for t in tools or ():
        schema = getattr(t, "schema", t)
        fn = schema.get("function", schema) if isinstance(schema, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            found.append(dict(fn))
    return found


def string_parameters(tools: Iterable[Any] | None) -> dict[str, set[str]]:
    """For each tool, the parameters whose schema is a string (or an optional string)."""
    found: dict[str, set[str]] = {}
    for fn in function_schemas(tools):
        props = (fn.get("parameters") or {}).get("properties") or {}
        found[fn["name"]] = {
            k for k, s in props.items() if isinstance(s, Mapping) and _is_string(s)
        }
    return found


_EXAMPLE_VALUES = {
    "string": "...",
    "integer": 1,
    "number": 1.5,
    "boolean": True,
    "array": [],
    "object": {},
}


def example_arguments(function: Mapping[str, Any]) -> dict[str, Any]:
    """Placeholder values for a function's required parameters (enum choices and defaults first)."""
    parameters = function.get("parameters") or {}
    props = parameters.get("properties") or {}
    example = {}
    for name in parameters.get("required") or []:
        schema = props.get(name) or {}
        options = [schema, *(schema.get("anyOf") or [])]
        if schema.get("enum"):
            example[name] = schema["enum"][0]
        else:
            kinds = [o.get("type") for o in options if isinstance(o, Mapping)]
            example[name] = next((_EXAMPLE_VALUES[k] for k in kinds if k in _EXAMPLE_VALUES), "...")
    return example


def _is_string(schema: Mapping[str, Any]) -> bool:
    options = schema.get("anyOf") or [schema]
    types = {o.get("type") for o in options if isinstance(o, Mapping)}
    return "string" in types and types <= {"string", "null"}


def call_from_object(obj: Any, raw: str, argument_keys: Sequence[str]) -> ToolCall:
    """A ToolCall from a decoded ``{"name": ..., <argument key>: {...}}`` object, or a malformed
    one saying what is wrong. Arguments encoded as a JSON string are decoded; absent ones are {}."""
    if not isinstance(obj, dict):
        return malformed(raw, f"expected a JSON object with a 'name', got a {type(obj).__name__}")
    name = obj.get("name")
    if "name" not in obj:
        keys = ", ".join(map(repr, obj)) or "none"
        return malformed(raw, f"the call has no 'name' (keys: {keys})")
    if not isinstance(name, str) or not name:
        return malformed(raw, f"'name' must be a non-empty string, got {json.dumps(name)[:40]}")
    key = next((k for k in argument_keys if k in obj), None)
    args = obj.get(key) if key else {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except JSON_ERRORS as e:
            return malformed(
                raw, f"'{key}' of {name!r} is a string that is not valid JSON ({e})", name
            )
    if not isinstance(args, dict):
        return malformed(
            raw, f"'{key}' of {name!r} must be a JSON object, got a {type(args).__name__}", name
        )
    return ToolCall(name, args, raw=raw)


def malformed(raw: str, error: str, name: str = "") -> ToolCall:
    """A call that looked intended but could not be read."""
    return ToolCall(name, {}, status="malformed", raw=raw, error=error)


def decode_json_at(text: str, index: int) -> tuple[Any, int] | None:
    """Decode one JSON value starting at ``text[index]``; None when there is none."""
    try:
        return JSON_DECODER.raw_decode(text, index)
    except JSON_ERRORS:
        return None


def skip_space(text: str, index: int, extra: str = "") -> int:
    """Index of the first character at or after ``index`` that is not whitespace or in ``extra``."""
    while index < len(text) and (text[index].isspace() or text[index] in extra):
        index += 1
    return index


def to_assistant_message(result: ParseResult) -> Message:
    """The OpenAI assistant message for a parse: content plus every call in ``tool_calls``.

    A malformed call keeps the text the model wrote as its arguments string and adds
    ``"status": "malformed"`` and ``"error"`` to its entry, so that
    :meth:`vime.types.ToolCall.from_openai` reads it back as the same malformed call (vLLM
    ignores the extra keys when the message is sent back in a conversation).
    """
    message: Message = {"role": "assistant", "content": result.content}
    if result.calls:
        message["tool_calls"] = [_entry(c) for c in result.calls]
    return message


def _entry(call: ToolCall) -> dict[str, Any]:
    if call.status == "ok":
        return call.to_openai()
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.raw},
        "status": "malformed",
        "error": call.error,
    }
