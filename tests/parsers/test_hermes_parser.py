"""Hermes / Qwen ``<tool_call>`` parsing on the outputs models actually produce."""

import dataclasses

import pytest

from vime.tool_parsers import get_parser, to_assistant_message
from vime.types import ToolCall

parser = get_parser("hermes")


def test_qwen_style_message_with_content_and_two_calls():
    first = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    second = (
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'
    )
    text = f"Let me check both.\n{first}\n{second}"
    result = parser.parse(text)
    assert result.content == "Let me check both."
    assert result.calls == [
        ToolCall("weather", {"city": "Paris"}, "call_0", raw=first),
        ToolCall("weather", {"city": "Oslo", "days": 2}, "call_1", raw=second),
    ]
    assert result.raw == text
    assert result.num_malformed == 0


def test_text_without_calls_is_all_content():
    result = parser.parse("  The answer is 42.  ")
    assert (result.content, result.calls) == ("The answer is 42.", [])


def test_closing_tag_inside_a_json_string_does_not_end_the_call():
    text = '<tool_call>{"name": "say", "arguments": {"text": "</tool_call> is a tag"}}</tool_call>'
    (call,) = parser.parse(text).calls
    assert call.arguments == {"text": "</tool_call> is a tag"}


def test_unclosed_block_at_the_end_still_counts_when_its_json_is_complete():
    (call,) = parser.parse('ok <tool_call>{"name": "f", "arguments": {}}').calls
    assert (call.name, call.status) == ("f", "ok")


def test_parameters_key_and_string_encoded_arguments_are_accepted():
    text = (
        '<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "g", "arguments": "{\\"b\\": 2}"}</tool_call>'
    )
    assert [(c.name, c.arguments) for c in parser.parse(text).calls] == [
        ("f", {"a": 1}),
        ("g", {"b": 2}),
    ]


def test_malformed_blocks_are_reported_and_do_not_hide_good_ones():
    text = (
        "<tool_call>{'name': 'f'}</tool_call>"
        '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "g", "arguments": [1]}</tool_call>'
        "<tool_call>  </tool_call>"
        '<tool_call>{"name": "h"} trailing</tool_call>'
    )
    calls = parser.parse(text).calls
    assert [c.status for c in calls] == [
        "malformed",
        "ok",
        "malformed",
        "malformed",
        "malformed",
        "malformed",
    ]
    assert calls[0].error.startswith(
        "the <tool_call> block is not valid JSON (Expecting property name"
    )
    assert calls[0].raw == "<tool_call>{'name': 'f'}</tool_call>"
    assert calls[2].error == "the call has no 'name' (keys: 'arguments')"
    assert (calls[3].name, calls[3].error) == (
        "g",
        "'arguments' of 'g' must be a JSON object, got a list",
    )
    assert calls[4].error == "empty <tool_call> block"
    assert calls[5].error.startswith("the <tool_call> block is not valid JSON (Extra data")
    assert [c.id for c in calls] == [f"call_{i}" for i in range(6)]


def test_assistant_message_keeps_every_call():
    result = parser.parse(
        'Hi <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call><tool_call>{bad</tool_call>'
    )
    assert to_assistant_message(result) == {
        "role": "assistant",
        "content": "Hi",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "f", "arguments": '{"x": 1}'},
            },
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "", "arguments": "<tool_call>{bad</tool_call>"},
                "status": "malformed",
                "error": result.calls[1].error,
            },
        ],
    }
    assert to_assistant_message(parser.parse("plain")) == {"role": "assistant", "content": "plain"}


def test_assistant_message_reads_back_to_the_same_calls():
    text = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call><tool_call>{"name": "g", "arguments": 5}</tool_call>'
    result = parser.parse(text)
    message = to_assistant_message(result)
    assert [ToolCall.from_openai(e) for e in message["tool_calls"]] == [
        dataclasses.replace(result.calls[0], raw='{"x": 1}'),
        result.calls[1],
    ]


@pytest.mark.parametrize(
    "text",
    [
        "I can do this without a <tool_call>: 2 + 3 = \\boxed{5}",
        "def is_call(s):\n    return s.startswith('<tool_call>')\n",
        'tags look like "<tool_call>" and </tool_call>',
    ],
)
def test_prose_that_mentions_the_tag_stays_content(text):
    result = parser.parse(text)
    assert result.calls == [] and result.content == text.strip()


def test_a_mention_does_not_hide_a_real_call_after_it():
    text = 'No <tool_call> yet.\n<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    result = parser.parse(text)
    assert result.content == "No <tool_call> yet."
    assert [(c.name, c.arguments, c.status) for c in result.calls] == [("f", {"x": 1}, "ok")]


def test_a_broken_call_still_becomes_a_malformed_call_with_the_reason():
    (call,) = parser.parse('<tool_call>{"name": "f", "arguments": {"x": </tool_call>').calls
    assert call.status == "malformed" and "not valid JSON" in call.error
