"""Tool-call parsers per model family, looked up by name: ``get_parser("hermes").parse(text)``.

Built in: ``hermes`` (aliases ``qwen``, ``qwen2``, ``qwen3``), ``llama3`` (``llama``) and ``xml``
(Qwen3-Coder's ``<function=...>`` tags; alias ``qwen3_coder``).
"""

from __future__ import annotations

import difflib

from vime.tool_parsers.base import ParseResult, ToolCallParser, to_assistant_message
from vime.tool_parsers.hermes import HermesParser
from vime.tool_parsers.llama3 import Llama3JsonParser
from vime.tool_parsers.xml import XmlParser

__all__ = [
    "HermesParser",
    "Llama3JsonParser",
    "ParseResult",
    "ToolCallParser",
    "XmlParser",
    "available_parsers",
    "get_parser",
    "register_parser",
    "to_assistant_message",
]

_PARSERS: dict[str, ToolCallParser] = {}


def register_parser(
    name: str,
    parser: ToolCallParser | type[ToolCallParser],
    aliases: tuple[str, ...] | list[str] = (),
    *,
    replace: bool = False,
) -> ToolCallParser:
    """Make ``parser`` (an instance or a class) available as ``name`` and its aliases.

    Names are case-insensitive; taking a name already in use needs ``replace=True``.
    """
    instance = parser() if isinstance(parser, type) else parser
    if not isinstance(instance, ToolCallParser):
        raise TypeError(f"register_parser needs a ToolCallParser, got {parser!r}")
    keys = [k.lower() for k in (name, *aliases)]
    taken = [k for k in keys if k in _PARSERS and _PARSERS[k] is not instance]
    if taken and not replace:
        raise ValueError(
            f"tool-call parser name(s) {taken} already registered; pass replace=True to override"
        )
    for k in keys:
        _PARSERS[k] = instance
    return instance


def get_parser(name: str | ToolCallParser) -> ToolCallParser:
    """The parser registered as ``name`` (a parser instance is returned as is)."""
    if isinstance(name, ToolCallParser):
        return name
    parser = _PARSERS.get(str(name).lower())
    if parser is None:
        close = difflib.get_close_matches(str(name).lower(), list(_PARSERS), n=2)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"unknown tool-call parser {name!r}.{hint} Known: {', '.join(available_parsers())}."
        )
    return parser


def available_parsers() -> list[str]:
    """Every registered name and alias, sorted."""
    return sorted(_PARSERS)


register_parser("hermes", HermesParser, ("qwen", "qwen2", "qwen2.5", "qwen3"))
register_parser("llama3", Llama3JsonParser, ("llama", "llama3.1", "llama3.2", "llama3.3"))
register_parser("xml", XmlParser, ("qwen3_coder",))
