"""Property tests for every built-in parser: arbitrary text never raises, and calls rendered in a
family's format parse back to the same names and arguments."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vime.tool_parsers import get_parser, to_assistant_message
from vime.tool_parsers.llama3 import PYTHON_TAG
from vime.types import ToolCall

FAMILIES = ["hermes", "llama3", "xml"]
# derandomize: CI must be deterministic, so every run tries the same examples.
FUZZ = settings(
    max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)

# Pieces of every family's syntax, so random text often looks almost like a call.
FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>",
    PYTHON_TAG, "{", "}", "[", "]", '"', ":", ";", ",", "\n", " ", "\\", "name", '"name"',
    '"arguments"', '"parameters"', "null", "1", "f", ">", "<", "</", "<think>", "</think>",
]  # fmt: skip
syntaxish = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=30).map("".join)
any_text = st.text(max_size=300) | syntaxish

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
DIGITS = "0123456789"


def identifiers(extra: str = "") -> st.SearchStrategy[str]:
    """Python-like identifiers (plus ``extra`` characters after the first)."""
    rest = st.text(alphabet=LETTERS + DIGITS + extra, max_size=12)
    return st.builds(lambda first, tail: first + tail, st.sampled_from(LETTERS), rest)


names = identifiers("-")
keys = identifiers()
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
arguments = st.dictionaries(keys, json_values, max_size=4)
calls = st.lists(st.builds(lambda n, a: ToolCall(n, a), names, arguments), min_size=1, max_size=3)
# Content that cannot be mistaken for any family's call syntax.
plain_content = st.text(alphabet=st.characters(blacklist_characters='<>{}[];"\\'), max_size=40)


@pytest.mark.parametrize("family", FAMILIES)
@FUZZ
@given(text=any_text)
def test_arbitrary_text_never_raises_and_is_accounted_for(family, text):
    result = get_parser(family).parse(text)
    assert result.raw == text
    assert [c.id for c in result.calls] == [f"call_{i}" for i in range(len(result.calls))]
    for call in result.calls:
        assert call.status in ("ok", "malformed")
        assert (call.error is None) == (call.status == "ok")
        assert isinstance(call.arguments, dict)
        assert call.raw and call.raw.strip() in text  # every call points back at what was written
    json.dumps(to_assistant_message(result))  # the record is always serialisable


@pytest.mark.parametrize("family", FAMILIES)
@FUZZ
@given(expected=calls)
def test_rendered_calls_parse_back_equal(family, expected):
    parser = get_parser(family)
    result = parser.parse(parser.render(expected))
    assert [(c.name, c.arguments, c.status) for c in result.calls] == [
        (c.name, c.arguments, "ok") for c in expected
    ]
    assert result.content == ""


@pytest.mark.parametrize("family", ["hermes", "xml"])
@FUZZ
@given(before=plain_content, expected=calls, after=plain_content)
def test_text_around_calls_is_kept_as_content(family, before, expected, after):
    parser = get_parser(family)
    result = parser.parse(f"{before}\n{parser.render(expected)}\n{after}")
    assert [(c.name, c.arguments) for c in result.calls] == [
        (c.name, c.arguments) for c in expected
    ]
    assert result.content.split() == f"{before} {after}".split()


@FUZZ
@given(before=plain_content, expected=calls)
def test_llama3_text_before_the_python_tag_is_content(before, expected):
    parser = get_parser("llama3")
    result = parser.parse(f"{before}{PYTHON_TAG}{parser.render(expected)}")
    assert [(c.name, c.arguments) for c in result.calls] == [
        (c.name, c.arguments) for c in expected
    ]
    assert result.content == before.strip()


@FUZZ
@given(name=names, values=st.dictionaries(keys, st.text(max_size=20), max_size=4))
def test_xml_string_parameters_round_trip_with_the_tool_schema(name, values):
    schema = {
        "type": "function",
        "function": {
            "name": name,
            "description": "d",
            "parameters": {"type": "object", "properties": {k: {"type": "string"} for k in values}},
        },
    }
    parser = get_parser("xml")
    (call,) = parser.parse(parser.render([ToolCall(name, values)]), tools=[schema]).calls
    assert call.arguments == values
