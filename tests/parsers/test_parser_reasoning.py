"""Leading reasoning (``<think>...</think>``) is content: calls drafted while thinking are not made."""

import pytest

from vime.tool_parsers import get_parser

CALLS = {
    "hermes": '<tool_call>{"name": "NAME", "arguments": {}}</tool_call>',
    "llama3": '{"name": "NAME", "parameters": {}}',
    "xml": "<function=NAME></function>",
}


@pytest.mark.parametrize("family", sorted(CALLS))
def test_calls_inside_leading_reasoning_are_content(family):
    draft, real = CALLS[family].replace("NAME", "draft"), CALLS[family].replace("NAME", "real")
    thinking = f"<think>I could write {draft} here.</think>"
    result = get_parser(family).parse(f"  {thinking}\n\n{real}")
    assert [c.name for c in result.calls] == ["real"]
    assert result.content == thinking


def test_a_closing_think_tag_alone_is_ordinary_text():
    text = '<tool_call>{"name": "say", "arguments": {"text": "</think>"}}</tool_call>'
    (call,) = get_parser("hermes").parse(text).calls
    assert call.arguments == {"text": "</think>"}
    (call,) = get_parser("llama3").parse('{"name": "A", "parameters": {"</think>": null}}').calls
    assert call.arguments == {"</think>": None}


def test_unclosed_reasoning_holds_no_calls():
    result = get_parser("hermes").parse(
        '<think>still thinking <tool_call>{"name": "f"}</tool_call>'
    )
    assert result.calls == []


def test_think_tags_after_the_start_are_ordinary_text():
    text = '<tool_call>{"name": "say", "arguments": {"text": "<think>"}}</tool_call>'
    (call,) = get_parser("hermes").parse(text).calls
    assert call.arguments == {"text": "<think>"}
