"""execute_tool_calls: every model-side fault becomes an error outcome, never an exception."""

import asyncio
import dataclasses
import threading
import time

import pytest

from vime.envs import tool_threads
from vime.envs import tools as tools_module
from vime.envs.tools import ToolOutcome, execute_tool_calls, format_result, tool
from vime.types import ToolCall


@tool
def add(a: int, b: int = 1) -> int:
    """Add two integers.

    Args:
        a: First term.
        b: Second term.
    """
    return a + b


@tool
async def echo(text: str) -> str:
    """Echo text back."""
    await asyncio.sleep(0)
    return text


@tool
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b


TOOLS = [add, echo, divide]


async def run_one(call, tools=TOOLS, **kwargs) -> ToolOutcome:
    (outcome,) = await execute_tool_calls(tools, [call], **kwargs)
    return outcome


async def test_sync_and_async_tools_run_and_answer_in_call_order():
    calls = [
        ToolCall("add", {"a": 2, "b": 3}, "call_0"),
        ToolCall("echo", {"text": "hi"}, "call_1"),
    ]
    outcomes = await execute_tool_calls(TOOLS, calls)
    assert [o.content for o in outcomes] == ["5", "hi"]
    assert [o.value for o in outcomes] == [5, "hi"]
    assert all(o.ok and o.error_kind is None for o in outcomes)
    assert outcomes[0].to_message() == {
        "role": "tool",
        "tool_call_id": "call_0",
        "name": "add",
        "content": "5",
    }


async def test_openai_tool_call_dicts_are_accepted():
    call = {"id": "c9", "type": "function", "function": {"name": "add", "arguments": '{"a": "4"}'}}
    outcome = await run_one(call)
    assert (outcome.call.id, outcome.content, outcome.value) == ("c9", "5", 5)


async def test_unknown_tool_names_the_closest_ones():
    outcome = await run_one(ToolCall("ad", {"a": 1}, "call_0"))
    assert outcome.error_kind == "unknown_tool"
    assert (
        outcome.content
        == "Error: unknown tool 'ad'. Did you mean 'add'? Available tools: add, divide, echo."
    )
    assert outcome.to_message()["content"] == outcome.content
    none = await run_one(ToolCall("ad", {}), tools=[])
    assert none.error == "unknown tool 'ad': no tools are available here"


async def test_malformed_call_becomes_an_error_observation():
    call = ToolCall.from_openai({"id": "c1", "function": {"name": "add", "arguments": "{'a': 1}"}})
    outcome = await run_one(call)
    assert outcome.error_kind == "malformed"
    assert outcome.content.startswith(
        "Error: the call to tool 'add' could not be parsed: arguments are not valid JSON"
    )
    nameless = await run_one(ToolCall("", {}, status="malformed", error="no JSON object found"))
    assert nameless.error == "the tool call could not be parsed: no JSON object found"


async def test_wrong_argument_types_are_reported_not_run():
    outcome = await run_one(ToolCall("add", {"a": "two"}, "call_0"))
    assert outcome.error_kind == "invalid_arguments"
    assert outcome.content == (
        "Error: invalid arguments for tool 'add': argument 'a': Input should be a valid integer, "
        'unable to parse string as an integer (got "two")'
    )
    assert outcome.value is None


async def test_exceptions_inside_tools_are_caught_with_their_message():
    outcome = await run_one(ToolCall("divide", {"a": 1, "b": 0}, "call_0"))
    assert outcome.error_kind == "exception"
    assert (
        outcome.content == "Error: tool 'divide' raised ZeroDivisionError: float division by zero"
    )


async def test_async_tool_exceptions_are_caught():
    @tool
    async def boom() -> None:
        """Explode."""
        raise RuntimeError("kaboom")

    outcome = await run_one(ToolCall("boom", {}), tools=[boom])
    assert (outcome.error_kind, outcome.error) == (
        "exception",
        "tool 'boom' raised RuntimeError: kaboom",
    )


async def test_hanging_sync_tool_ends_at_the_timeout(monkeypatch):
    monkeypatch.setattr(tool_threads, "_POOL", tool_threads.DaemonPool(2))
    await run_one(ToolCall("add", {"a": 1}))  # warm: an idle thread takes the next call at once
    release = threading.Event()

    @tool
    def hang() -> str:
        """Never returns on its own."""
        release.wait(10)
        return "late"

    start = time.perf_counter()
    try:
        outcome = await run_one(ToolCall("hang", {}), tools=[hang], timeout=0.5)
    finally:
        release.set()
    elapsed = time.perf_counter() - start
    assert outcome.error_kind == "timeout"
    assert outcome.error == "tool 'hang' timed out after 0.5 s; its thread was abandoned"
    assert 0.5 <= elapsed < 3
    assert 0.5 <= outcome.duration < 3


async def test_hanging_async_tool_is_cancelled_at_the_timeout():
    cancelled = asyncio.Event()

    @tool
    async def stall() -> str:
        """Waits forever."""
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    start = time.perf_counter()
    outcome = await run_one(ToolCall("stall", {}), tools=[stall], timeout=0.2)
    assert outcome.error == "tool 'stall' timed out after 0.2 s"
    assert outcome.error_kind == "timeout"
    assert cancelled.is_set()
    assert time.perf_counter() - start < 3


async def test_async_tool_that_ignores_cancellation_is_abandoned(monkeypatch):
    monkeypatch.setattr(tools_module, "CANCEL_GRACE_S", 0.1)
    stop = asyncio.Event()

    @tool
    async def stubborn() -> str:
        """Swallows cancellation."""
        while not stop.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                pass
        return "done"

    start = time.perf_counter()
    outcome = await run_one(ToolCall("stubborn", {}), tools=[stubborn], timeout=0.2)
    assert outcome.error == "tool 'stubborn' timed out after 0.2 s and ignored cancellation"
    assert time.perf_counter() - start < 3
    stop.set()
    await asyncio.sleep(0.1)


async def test_per_tool_timeout_overrides_the_default():
    @tool(timeout=0.1)
    async def slow() -> str:
        """Slow."""
        await asyncio.sleep(5)
        return "x"

    outcome = await run_one(ToolCall("slow", {}), tools=[slow], timeout=30)
    assert outcome.error == "tool 'slow' timed out after 0.1 s"


async def test_parallel_calls_overlap_and_keep_order():
    @tool
    async def nap(seconds: float, tag: str) -> str:
        """Sleep, then return tag."""
        await asyncio.sleep(seconds)
        return tag

    # c finishes first, yet outcomes follow the calls; one after another would take 1.0 s
    calls = [
        ToolCall("nap", {"seconds": s, "tag": t}) for s, t in [(0.5, "a"), (0.4, "b"), (0.1, "c")]
    ]
    start = time.perf_counter()
    outcomes = await execute_tool_calls([nap], calls, parallel=True)
    assert time.perf_counter() - start < 1.0
    assert [o.content for o in outcomes] == ["a", "b", "c"]


async def test_sequential_calls_see_each_others_effects():
    class Notes:
        def __init__(self) -> None:
            self.lines: list[str] = []

        @tool
        def write(self, line: str) -> int:
            """Append a line; return the count."""
            self.lines.append(line)
            return len(self.lines)

        @tool
        async def read(self) -> list[str]:
            """All lines."""
            return self.lines

    notes = Notes()
    calls = [
        ToolCall("write", {"line": "a"}),
        ToolCall("write", {"line": "b"}),
        ToolCall("read", {}),
    ]
    outcomes = await execute_tool_calls({"write": notes.write, "read": notes.read}, calls)
    assert [o.content for o in outcomes] == ["1", "2", '["a", "b"]']
    assert Notes().lines == []  # the bound tools touched only `notes`


async def test_bound_methods_of_two_instances_share_no_state():
    class Counter:
        def __init__(self, start: int) -> None:
            self.value = start

        @tool
        def bump(self, by: int = 1) -> int:
            """Increase the counter."""
            self.value += by
            return self.value

    a, b = Counter(0), Counter(100)
    (oa,) = await execute_tool_calls([a.bump], [ToolCall("bump", {"by": 2})])
    (ob,) = await execute_tool_calls([b.bump], [ToolCall("bump", {})])
    assert (oa.content, ob.content, a.value, b.value) == ("2", "101", 2, 101)


async def test_static_and_class_methods_can_be_tools():
    class Maths:
        base = 10

        @tool
        @staticmethod
        def double(x: int) -> int:
            """Double x."""
            return 2 * x

        @tool
        @classmethod
        def offset(cls, x: int) -> int:
            """Add the class base."""
            return cls.base + x

    assert list(Maths.offset.parameters["properties"]) == ["x"]
    outcomes = await execute_tool_calls(
        [Maths.double, Maths().offset], [ToolCall("double", {"x": 4}), ToolCall("offset", {"x": 1})]
    )
    assert [o.content for o in outcomes] == ["8", "11"]


def test_duplicate_tool_names_are_a_programming_error():
    twin = tool(add.fn, name="add")
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        asyncio.run(execute_tool_calls([add, twin], []))


@dataclasses.dataclass
class Reading:
    value: float
    unit: str


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain", "plain"),
        (None, ""),
        (b"bytes\xff", "bytes\ufffd"),
        (3, "3"),
        ({"a": [1, 2], "é": None}, '{"a": [1, 2], "é": null}'),
        (Reading(1.5, "m"), '{"value": 1.5, "unit": "m"}'),
    ],
)
def test_results_are_turned_into_text_for_the_model(value, text):
    assert format_result(value) == text


async def test_parser_errors_reach_the_model_through_the_assistant_message():
    from vime.tool_parsers import get_parser, to_assistant_message

    text = (
        "<function=add><parameter=a>1</function><function=add><parameter=a>2</parameter></function>"
    )
    message = to_assistant_message(get_parser("xml").parse(text, tools=TOOLS))
    outcomes = await execute_tool_calls(TOOLS, message["tool_calls"])
    assert [(o.call.id, o.error_kind, o.content) for o in outcomes] == [
        (
            "call_0",
            "malformed",
            "Error: the call to tool 'add' could not be parsed: parameter 'a' has no closing </parameter>",
        ),
        ("call_1", None, "3"),
    ]


def test_vime_tool_is_this_decorator():
    import vime

    assert vime.tool is tool
    assert vime.Tool is tools_module.Tool
