"""The parser registry: lookup by family name or alias, and registering new parsers."""

import pytest

from vime import tool_parsers
from vime.tool_parsers import (
    HermesParser,
    Llama3JsonParser,
    ToolCallParser,
    XmlParser,
    available_parsers,
    get_parser,
    register_parser,
)
from vime.types import ToolCall


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("hermes", HermesParser),
        ("qwen", HermesParser),
        ("Qwen2", HermesParser),
        ("qwen3", HermesParser),
        ("llama3", Llama3JsonParser),
        ("llama", Llama3JsonParser),
        ("xml", XmlParser),
    ],
)
def test_families_and_aliases_resolve(name, cls):
    assert type(get_parser(name)) is cls


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(
        ValueError,
        match=r"unknown tool-call parser 'hermez'\. Did you mean 'hermes'\? Known: hermes, llama,",
    ):
        get_parser("hermez")


def test_a_parser_instance_passes_through():
    p = XmlParser()
    assert get_parser(p) is p


class Shout(ToolCallParser):
    """A toy format: ``CALL name`` on a line of its own."""

    name = "shout"

    def _parse(self, text, string_params):
        lines = text.splitlines()
        calls = [ToolCall(line[5:], {}, raw=line) for line in lines if line.startswith("CALL ")]
        return "\n".join(line for line in lines if not line.startswith("CALL ")), calls

    def render(self, calls):
        return "\n".join(f"CALL {c.name}" for c in calls)


def test_registering_a_parser_with_aliases(monkeypatch):
    monkeypatch.setattr(tool_parsers, "_PARSERS", dict(tool_parsers._PARSERS))
    registered = register_parser("shout", Shout, aliases=("loud",))
    assert get_parser("LOUD") is registered
    assert {"shout", "loud"} <= set(available_parsers())
    result = get_parser("shout").parse("hi\nCALL ping\nCALL pong")
    assert (result.content, [(c.name, c.id) for c in result.calls]) == (
        "hi",
        [("ping", "call_0"), ("pong", "call_1")],
    )
    with pytest.raises(ValueError, match=r"\['shout'\] already registered"):
        register_parser("shout", Shout())
    assert register_parser("shout", Shout(), replace=True) is get_parser("shout")
    with pytest.raises(TypeError, match="needs a ToolCallParser"):
        register_parser("bad", object())


def test_a_buggy_parser_keeps_the_text_as_content(caplog):
    class Buggy(Shout):
        def _parse(self, text, string_params):
            raise KeyError("bug")

    result = Buggy().parse("  some text ")
    assert (result.content, result.calls, result.raw) == ("some text", [], "  some text ")
    assert "failed; keeping the text as content" in caplog.text


def test_none_text_parses_as_empty():
    result = get_parser("hermes").parse(None)
    assert (result.content, result.calls, result.raw) == ("", [], "")
