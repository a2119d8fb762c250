"""ToolCall.from_openai reads OpenAI tool_calls entries and never raises for model faults."""

import pytest

from vime.types import ToolCall


def entry(arguments, name="add", call_id="call_7"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_json_arguments_are_parsed():
    call = ToolCall.from_openai(entry('{"a": 1, "b": [2]}'))
    assert call == ToolCall("add", {"a": 1, "b": [2]}, "call_7", "ok", '{"a": 1, "b": [2]}', None)


def test_round_trip_through_to_openai():
    call = ToolCall("search", {"q": "x", "n": 3}, "call_0")
    back = ToolCall.from_openai(call.to_openai())
    assert (back.name, back.arguments, back.id, back.status) == (
        "search",
        {"q": "x", "n": 3},
        "call_0",
        "ok",
    )


def test_already_decoded_arguments_are_accepted():
    assert ToolCall.from_openai(entry({"a": 1})).arguments == {"a": 1}


@pytest.mark.parametrize("arguments", ["", "   ", None])
def test_empty_arguments_mean_no_arguments(arguments):
    call = ToolCall.from_openai(entry(arguments))
    assert call.status == "ok" and call.arguments == {}


def test_bad_json_is_malformed_and_keeps_the_raw_text():
    call = ToolCall.from_openai(entry('{"a": 1,'))
    assert call.status == "malformed"
    assert call.name == "add" and call.id == "call_7" and call.arguments == {}
    assert call.raw == '{"a": 1,'
    assert call.error.startswith("arguments are not valid JSON (")


@pytest.mark.parametrize(("arguments", "kind"), [("[1, 2]", "list"), ('"x"', "str"), ("3", "int")])
def test_arguments_that_are_not_an_object_are_malformed(arguments, kind):
    call = ToolCall.from_openai(entry(arguments))
    assert call.status == "malformed"
    assert call.error.startswith(f"arguments must be a JSON object, got a {kind}")


@pytest.mark.parametrize(
    "bad", [{"id": "c"}, {"function": "add"}, "add(1)", None, entry("{}", name="")]
)
def test_entries_without_a_function_name_are_malformed(bad):
    call = ToolCall.from_openai(bad)
    assert call.status == "malformed" and call.name == "" and call.error


def test_openai_sdk_objects_are_accepted():
    from openai.types.chat import ChatCompletionMessageToolCall

    sdk = ChatCompletionMessageToolCall.model_validate(entry('{"a": 2}'))
    assert ToolCall.from_openai(sdk) == ToolCall("add", {"a": 2}, "call_7", raw='{"a": 2}')
