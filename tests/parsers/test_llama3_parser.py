"""Llama 3.x JSON tool-call parsing."""

from vime.tool_parsers import get_parser

parser = get_parser("llama3")


def test_bare_json_message_is_one_call():
    (call,) = parser.parse('{"name": "search", "parameters": {"q": "vime"}}').calls
    assert (call.name, call.arguments, call.id, call.status) == (
        "search",
        {"q": "vime"},
        "call_0",
        "ok",
    )


def test_python_tag_and_semicolon_separated_calls():
    text = 'Checking.<|python_tag|>{"name": "a", "parameters": {"x": "1;2"}}; {"name": "b", "arguments": {}}'
    result = parser.parse(text)
    assert result.content == "Checking."
    assert [(c.name, c.arguments) for c in result.calls] == [("a", {"x": "1;2"}), ("b", {})]


def test_plain_text_and_json_without_a_name_are_content():
    for text in ["The answer is {x}.", '{"answer": 42}', "  hello  "]:
        result = parser.parse(text)
        assert (result.content, result.calls) == (text.strip(), [])


def test_text_after_the_calls_is_content():
    result = parser.parse('{"name": "f", "parameters": {}}\nDone.')
    assert [c.name for c in result.calls] == ["f"]
    assert result.content == "Done."


def test_broken_json_that_looks_like_a_call_is_malformed():
    (call,) = parser.parse('{"name": "f", "parameters": {"x": 1}').calls
    assert call.status == "malformed"
    assert call.error.startswith("not valid JSON: Expecting ',' delimiter")
    assert call.raw == '{"name": "f", "parameters": {"x": 1}'


def test_second_call_broken_keeps_the_first():
    calls = parser.parse('{"name": "f", "parameters": {}}; {"name": "g", "parameters": {').calls
    assert [(c.name, c.status) for c in calls] == [("f", "ok"), ("", "malformed")]


def test_python_tag_followed_by_code_is_malformed():
    result = parser.parse("<|python_tag|>print(1)")
    (call,) = result.calls
    assert call.status == "malformed"
    assert call.error == "expected JSON tool calls after <|python_tag|>, got 'print(1)'"
    assert call.raw == "<|python_tag|>print(1)"
    assert result.content == ""


def test_wrong_shapes_are_malformed_with_the_reason():
    calls = parser.parse(
        '<|python_tag|>{"name": 3, "parameters": {}}; {"name": "f", "parameters": "x"}'
    ).calls
    assert [c.error for c in calls] == [
        "'name' must be a non-empty string, got 3",
        "'parameters' of 'f' is a string that is not valid JSON (Expecting value: line 1 column 1 (char 0))",
    ]
