"""Differential test: on well-formed calls, our hermes and llama3 parsers find the same calls as
vLLM's own tool parsers (what `vllm serve --tool-call-parser ...` returns to clients)."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vime.tool_parsers import get_parser
from vime.tool_parsers.llama3 import PYTHON_TAG
from vime.types import ToolCall

pytestmark = pytest.mark.slow

AGREE = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # CI must be deterministic: the same examples on every run
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
calls = st.lists(
    st.builds(
        ToolCall, names, st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=4)
    ),
    min_size=1,
    max_size=3,
)
prose = st.text(alphabet=st.characters(blacklist_characters="<>{}"), max_size=30)


class _Tokenizer:
    """What vLLM's parsers read from a tokenizer when extracting whole messages."""

    def get_vocab(self) -> dict[str, int]:
        return {"<tool_call>": 1, "</tool_call>": 2, PYTHON_TAG: 3}


@pytest.fixture(scope="module")
def vllm_parsers():
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
    from vllm.tool_parsers.llama_tool_parser import Llama3JsonToolParser

    return {
        "hermes": Hermes2ProToolParser(_Tokenizer()),
        "llama3": Llama3JsonToolParser(_Tokenizer()),
    }


def vllm_calls(parser, text: str) -> list[tuple[str, dict]]:
    info = parser.extract_tool_calls(text, None)
    assert info.tools_called
    return [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]


def ours(family: str, text: str) -> list[tuple[str, dict]]:
    result = get_parser(family).parse(text)
    assert all(c.status == "ok" for c in result.calls)
    return [(c.name, c.arguments) for c in result.calls]


@AGREE
@given(before=prose, expected=calls)
def test_hermes_agrees_with_vllm(vllm_parsers, before, expected):
    text = f"{before}{get_parser('hermes').render(expected)}"
    assert ours("hermes", text) == vllm_calls(vllm_parsers["hermes"], text)


@AGREE
@given(expected=calls, tagged=st.booleans())
def test_llama3_agrees_with_vllm(vllm_parsers, expected, tagged):
    text = (PYTHON_TAG if tagged else "") + get_parser("llama3").render(expected)
    assert ours("llama3", text) == vllm_calls(vllm_parsers["llama3"], text)
