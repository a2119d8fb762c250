"""Hostile outputs: JSON nested past the decoder's recursion limit is a malformed call, not a
parser crash."""

from vime.tool_parsers import get_parser
from vime.types import ToolCall

DEEP = "[" * 100_000 + "]" * 100_000


def test_hermes_deep_nesting_is_malformed():
    text = f'ok <tool_call>{{"name": "f", "arguments": {{"a": {DEEP}}}}}</tool_call>'
    result = get_parser("hermes").parse(text)
    (call,) = result.calls
    assert (call.status, result.content) == ("malformed", "ok")
    assert "maximum recursion depth exceeded" in call.error


def test_llama3_deep_nesting_is_malformed():
    (call,) = get_parser("llama3").parse(f'{{"name": "f", "parameters": {{"a": {DEEP}}}}}').calls
    assert call.status == "malformed"
    assert call.error.startswith("not valid JSON: maximum recursion depth exceeded")


def test_xml_deeply_nested_value_stays_text():
    (call,) = (
        get_parser("xml").parse(f"<function=f><parameter=a>{DEEP}</parameter></function>").calls
    )
    assert (call.status, call.arguments) == ("ok", {"a": DEEP})


def test_from_openai_deep_nesting_is_malformed():
    call = ToolCall.from_openai({"id": "c", "function": {"name": "f", "arguments": DEEP}})
    assert call.status == "malformed"
    assert call.error.startswith("arguments are not valid JSON (maximum recursion depth exceeded")
