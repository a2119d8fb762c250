"""Property tests: whatever calls a model makes, validation and execution answer with outcomes and
never raise."""

import asyncio
import enum

from hypothesis import given, settings
from hypothesis import strategies as st

from vime.envs.tools import ERROR_KINDS, ToolArgumentError, execute_tool_calls, tool
from vime.types import ToolCall


class Mode(enum.Enum):
    FAST = "fast"
    SAFE = "safe"


@tool
def combine(
    count: int, words: list[str], mode: Mode = Mode.SAFE, ratio: float | None = None
) -> str:
    """Join words.

    Args:
        count: How many times.
        words: Words to join.
        mode: How to join.
        ratio: Unused.
    """
    return " ".join(words * count)


@tool
async def touch(path: str) -> str:
    """Touch a path."""
    return path


TOOLS = [combine, touch]
PROPERTY = settings(max_examples=50, deadline=None, derandomize=True)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
argument_names = st.sampled_from(["count", "words", "mode", "ratio", "path", "x"]) | st.text(
    max_size=6
)
arguments = st.dictionaries(argument_names, json_values, max_size=4) | json_values
tool_calls = st.builds(
    lambda name, args, status: ToolCall(
        name, args, status=status, error="bad" if status == "malformed" else None
    ),
    st.sampled_from(["combine", "touch", "combin", ""]) | st.text(max_size=8),
    arguments,
    st.sampled_from(["ok", "ok", "ok", "malformed"]),
)


@PROPERTY
@given(args=arguments)
def test_validate_accepts_or_raises_only_argument_errors(args):
    try:
        values = combine.validate(args)
    except ToolArgumentError as e:
        assert e.problems and all(isinstance(p, str) and p for p in e.problems)
    else:
        assert isinstance(values["count"], int) and not isinstance(values["count"], bool)
        assert all(isinstance(w, str) for w in values["words"])
        assert isinstance(values.get("mode", Mode.SAFE), Mode)


@PROPERTY
@given(calls=st.lists(tool_calls, max_size=4))
def test_execution_answers_every_call_in_order(calls):
    outcomes = asyncio.run(execute_tool_calls(TOOLS, calls, timeout=5))
    assert [o.call for o in outcomes] == calls
    for o in outcomes:
        assert o.error_kind in (None, *ERROR_KINDS)
        assert (o.error is None) == (o.error_kind is None)
        assert o.content.startswith("Error: ") if o.error else isinstance(o.content, str)
        assert o.to_message()["role"] == "tool"
