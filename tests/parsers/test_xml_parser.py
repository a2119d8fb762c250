"""Qwen3-Coder style ``<function=...><parameter=...>`` parsing."""

from vime.envs.tools import tool
from vime.tool_parsers import get_parser

parser = get_parser("xml")

QWEN3_CODER_OUTPUT = """I'll look at the file.
<tool_call>
<function=read_file>
<parameter=path>
src/main.py
</parameter>
<parameter=max_lines>
50
</parameter>
</function>
</tool_call>"""


def test_qwen3_coder_output_with_content():
    result = parser.parse(QWEN3_CODER_OUTPUT)
    assert result.content == "I'll look at the file."
    (call,) = result.calls
    assert (call.name, call.arguments, call.id) == (
        "read_file",
        {"path": "src/main.py", "max_lines": 50},
        "call_0",
    )
    assert call.raw == QWEN3_CODER_OUTPUT[QWEN3_CODER_OUTPUT.index("<tool_call>") :]


def test_wrapper_is_optional_and_values_may_be_inline():
    text = "<function=add><parameter=a>1</parameter><parameter=b>[2, 3]</parameter></function> done"
    result = parser.parse(text)
    assert [(c.name, c.arguments) for c in result.calls] == [("add", {"a": 1, "b": [2, 3]})]
    assert result.content == "done"


def test_multiline_string_values_keep_inner_newlines():
    text = (
        "<function=write>\n<parameter=code>\n\ndef f():\n    return 1\n\n</parameter>\n</function>"
    )
    (call,) = parser.parse(text).calls
    assert call.arguments == {"code": "\ndef f():\n    return 1\n"}


def test_tool_schemas_keep_string_parameters_as_text():
    @tool
    def lookup(key: str, count: int, note: str | None = None) -> str:
        """Look up a key."""
        return key

    text = "<function=lookup><parameter=key>123</parameter><parameter=count>4</parameter><parameter=note>null</parameter></function>"
    assert parser.parse(text).calls[0].arguments == {"key": 123, "count": 4, "note": None}
    typed = parser.parse(text, tools=[lookup]).calls[0].arguments
    assert typed == {"key": "123", "count": 4, "note": "null"}
    assert parser.parse(text, tools=[lookup.schema]).calls[0].arguments == typed


def test_function_left_open_at_the_end_still_counts():
    (call,) = parser.parse("<function=f>\n<parameter=x>\n1\n</parameter>\n").calls
    assert (call.name, call.arguments, call.status) == ("f", {"x": 1}, "ok")


def test_broken_blocks_are_malformed_with_the_reason():
    cases = {
        "<function=f><parameter=x>1</function>": "parameter 'x' has no closing </parameter>",
        "<function=f>hello<parameter=x>1</parameter></function>": "unexpected text 'hello' outside <parameter=...> tags",
        "<function=f><parameter=x>1</parameter><parameter=x>2</parameter></function>": "parameter 'x' is given twice",
        "<function=><parameter=x>1</parameter></function>": "a <function=...> tag has no name",
        "<function=f><parameter=>1</parameter></function>": "a <parameter=...> tag has no name",
    }
    for text, error in cases.items():
        (call,) = parser.parse(text).calls
        assert (call.status, call.error, call.raw) == ("malformed", error, text)


def test_a_bad_block_does_not_hide_the_next_one():
    text = "<function=f>junk</function><function=g><parameter=y>2</parameter></function>"
    assert [(c.name, c.status) for c in parser.parse(text).calls] == [
        ("f", "malformed"),
        ("g", "ok"),
    ]


def test_two_functions_in_one_wrapper_are_two_calls():
    text = (
        "<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n"
        "<function=b>\n</function>\n</tool_call>\nafter"
    )
    result = parser.parse(text)
    assert [(c.name, c.arguments, c.status) for c in result.calls] == [
        ("a", {"x": 1}, "ok"),
        ("b", {}, "ok"),
    ]
    assert result.content == "after"
