"""Tools for environments: ``@tool`` turns a typed, documented Python callable into an OpenAI
function schema with validated arguments, and ``execute_tool_calls`` runs model tool calls,
turning every model-side fault (bad JSON, unknown tool, bad arguments, timeout, exception) into an
error observation instead of an exception.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import difflib
import functools
import inspect
import json
import logging
import re
import sys
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from vime.envs.tool_schema import describe_parameters, underlying
from vime.envs.tool_threads import tool_threads
from vime.errors import VimeError
from vime.types import Message, ToolCall

log = logging.getLogger(__name__)

ErrorKind = Literal["malformed", "unknown_tool", "invalid_arguments", "timeout", "exception"]
ERROR_KINDS: tuple[str, ...] = typing.get_args(ErrorKind)

DEFAULT_TIMEOUT_S = 30.0
# An async tool that swallows cancellation gets this long to stop before it is abandoned.
CANCEL_GRACE_S = 1.0

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolArgumentError(VimeError, ValueError):
    """Arguments that do not fit a tool's schema; ``problems`` holds one sentence per fault."""

    def __init__(self, tool_name: str, problems: Sequence[str]) -> None:
        self.tool_name = tool_name
        self.problems = list(problems)
        super().__init__(f"invalid arguments for tool {tool_name!r}: " + "; ".join(self.problems))


class ToolTimeoutError(VimeError, TimeoutError):
    """A tool did not return within its time limit."""

    def __init__(self, tool_name: str, timeout: float, note: str = "") -> None:
        self.tool_name = tool_name
        self.timeout = timeout
        super().__init__(f"tool {tool_name!r} timed out after {timeout:g} s{note}")


# ---------------------------------------------------------------------------------------------
# The Tool object


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=repr)
    except Exception:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _loc(name: str, loc: tuple[Any, ...]) -> str:
    return name + "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in loc)


class Tool:
    """A callable exposed to the model: its OpenAI schema plus validated, time-limited calls.

    A ``Tool`` still calls like the function it wraps. Written in a class body, it binds like a
    method: ``env.search`` is a bound ``Tool`` whose schema omits ``self``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self._bind_owner = isinstance(fn, classmethod)
        if isinstance(fn, staticmethod | classmethod):
            fn = fn.__func__
        if not callable(fn):
            raise TypeError(f"@tool needs a function or callable, got {fn!r}")
        name = name or getattr(fn, "__name__", None)
        if not name or not _NAME_RE.match(name):
            raise ValueError(
                f"tool name {name!r} is invalid: use 1-64 letters, digits, '_' or '-' "
                "(pass name=...)"
            )
        if timeout is not None and timeout <= 0:
            raise ValueError(
                f"tool {name!r}: timeout must be positive seconds or None, got {timeout!r}"
            )
        self.fn = fn
        self.name = name
        self.timeout = timeout
        self.parameters, params, self._is_method, doc = describe_parameters(fn, name)
        self._params = {p.name: p for p in params}
        returns = (
            f"Returns: {doc.returns.description}" if doc.returns and doc.returns.description else ""
        )
        text = "\n\n".join(s for s in (doc.short_description, doc.long_description, returns) if s)
        self.description = description if description is not None else text
        if not self.description:
            raise ValueError(
                f"tool {name!r} has no docstring: describe what it does (the model reads it) "
                "or pass description=..."
            )
        self.is_async = inspect.iscoroutinefunction(underlying(fn))
        self._instance: Any = None
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry: ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def __set_name__(self, owner: type, attribute: str) -> None:
        self._attribute = attribute  # how pickling finds a bound tool again

    def __get__(self, instance: Any, owner: type | None = None) -> Tool:
        if self._bind_owner:
            instance = owner if owner is not None else type(instance)
        elif instance is None or not self._is_method:
            return self
        bound = object.__new__(Tool)
        bound.__dict__.update(self.__dict__, _instance=instance)
        return bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._instance is not None:
            return self.fn(self._instance, *args, **kwargs)
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        bound = f" bound to {self._instance!r}" if self._instance is not None else ""
        return f"<Tool {self.name}{bound}>"

    def __reduce__(self) -> Any:
        # Pickle by reference like functions do: a bound tool as the attribute of its instance,
        # a module-level tool by its qualified name, any other one rebuilt from its function.
        if self._instance is not None:
            return (getattr, (self._instance, self.__dict__.get("_attribute", self.__name__)))
        found: Any = sys.modules.get(self.__module__)
        for part in self.__qualname__.split("."):
            found = getattr(found, part, None)
        if found is self:
            return self.__qualname__
        return (_rebuild_tool, (self.fn, self.name, self.description, self.timeout))

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Check and convert model-supplied arguments; raise ToolArgumentError listing every fault.

        Conversions are pydantic's lax ones that cannot lose information (``"3"`` to 3 for an
        int, ``"red"`` to ``Color.RED``, objects to dataclasses/models); booleans are never
        taken as numbers.
        """
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError(
                self.name, [f"arguments must be a JSON object, got {_short(arguments)}"]
            )
        problems: list[str] = []
        for key in arguments:
            if key not in self._params:
                close = difflib.get_close_matches(str(key), list(self._params), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                expected = ", ".join(self._params) or "none"
                problems.append(f"unknown argument {key!r}{hint} (expected arguments: {expected})")
        values: dict[str, Any] = {}
        for p in self._params.values():
            if p.name not in arguments:
                if p.required:
                    problems.append(f"missing required argument {p.name!r}")
                continue
            value = arguments[p.name]
            if p.rejects_bool and isinstance(value, bool):
                problems.append(f"argument {p.name!r}: expected a number, got {_short(value)}")
                continue
            try:
                values[p.name] = p.adapter.validate_python(value)
            except ValidationError as e:
                for err in e.errors(include_url=False):
                    got = f" (got {_short(err['input'])})" if err["type"] != "missing" else ""
                    problems.append(f"argument {_loc(p.name, err['loc'])!r}: {err['msg']}{got}")
        if problems:
            raise ToolArgumentError(self.name, problems)
        return values

    def _invocation(self, values: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        args: list[Any] = [] if self._instance is None else [self._instance]
        kwargs = dict(values)
        for p in self._params.values():
            if p.positional_only:
                args.append(kwargs.pop(p.name, p.default))
        return args, kwargs

    async def ainvoke(self, arguments: Any, *, timeout: float | None = None) -> Any:
        """Validate ``arguments`` and run the tool; raise ToolArgumentError, ToolTimeoutError or
        whatever the tool raises. Sync tools run in a bounded pool of daemon threads."""
        args, kwargs = self._invocation(self.validate(arguments))
        if not self.is_async:
            future = tool_threads().submit(
                contextvars.copy_context().run, functools.partial(self.fn, *args, **kwargs)
            )
            try:
                return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
            except TimeoutError:
                note = (
                    "; it never started because every tool thread was busy"
                    if future.cancel()
                    else "; its thread was abandoned"
                )
                raise ToolTimeoutError(self.name, timeout or 0.0, note) from None
        task = asyncio.ensure_future(self.fn(*args, **kwargs))
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if done:
            return task.result()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
        if not done:
            _ABANDONED.add(task)
            task.add_done_callback(_ABANDONED.discard)
            raise ToolTimeoutError(self.name, timeout or 0.0, " and ignored cancellation")
        raise ToolTimeoutError(self.name, timeout or 0.0)


_ABANDONED: set[asyncio.Task[Any]] = set()


def _rebuild_tool(
    fn: Callable[..., Any], name: str, description: str, timeout: float | None
) -> Tool:
    return Tool(fn, name=name, description=description, timeout=timeout)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
) -> Any:
    """Decorate a typed function (sync or async, with a docstring) to make it a :class:`Tool`.

    Use as ``@tool`` or ``@tool(name=..., description=..., timeout=...)``. Parameter
    descriptions come from the docstring's Args/Parameters section (Google, NumPy or reST).
    """
    if fn is None:
        return lambda f: Tool(f, name=name, description=description, timeout=timeout)
    return Tool(fn, name=name, description=description, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# Running calls


@dataclasses.dataclass(frozen=True)
class ToolOutcome:
    """The result of one tool call: ``content`` goes back to the model (the error text when
    ``error`` is set); ``value`` is the tool's Python return value for the env's own use."""

    call: ToolCall
    content: str
    error: str | None = None
    error_kind: ErrorKind | None = None
    duration: float = 0.0
    value: Any = None

    @property
    def ok(self) -> bool:
        """True when the tool ran and returned."""
        return self.error is None

    def to_message(self) -> Message:
        """The ``role: tool`` chat message answering the call."""
        return {
            "role": "tool",
            "tool_call_id": self.call.id,
            "name": self.call.name,
            "content": self.content,
        }


def format_result(value: Any) -> str:
    """Text the model sees for a tool's return value: strings as they are, None as "", the rest
    as JSON (dataclasses, pydantic models, enums and sets included)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return json.dumps(to_jsonable_python(value, fallback=str), ensure_ascii=False)


def _registry(tools: Mapping[str, Tool] | Sequence[Tool]) -> dict[str, Tool]:
    if isinstance(tools, Mapping):
        return dict(tools)
    registry: dict[str, Tool] = {}
    for t in tools:
        if not isinstance(t, Tool):
            raise TypeError(
                f"expected Tool objects (decorate the function with @vime.tool), got {t!r}"
            )
        if t.name in registry:
            raise ValueError(f"two tools are named {t.name!r}; give one of them another name=")
        registry[t.name] = t
    return registry


def unknown_tool_message(name: str, known: Sequence[str]) -> str:
    """Error text for a call to a tool that does not exist, naming the closest ones."""
    if not known:
        return f"unknown tool {name!r}: no tools are available here"
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown tool {name!r}.{hint} Available tools: {', '.join(sorted(known))}."


async def _execute_one(
    registry: dict[str, Tool], call: ToolCall | Mapping[str, Any], timeout: float | None
) -> ToolOutcome:
    start = time.perf_counter()
    if not isinstance(call, ToolCall):
        call = ToolCall.from_openai(call)

    def fail(error: str, kind: ErrorKind) -> ToolOutcome:
        return ToolOutcome(call, f"Error: {error}", error, kind, time.perf_counter() - start)

    if call.status != "ok":
        what = f"the call to tool {call.name!r}" if call.name else "the tool call"
        return fail(f"{what} could not be parsed: {call.error or 'malformed call'}", "malformed")
    target = registry.get(call.name)
    if target is None:
        return fail(unknown_tool_message(call.name, list(registry)), "unknown_tool")
    limit = target.timeout if target.timeout is not None else timeout
    try:
        value = await target.ainvoke(call.arguments, timeout=limit)
        content = format_result(value)
    except ToolArgumentError as e:
        return fail(str(e), "invalid_arguments")
    except ToolTimeoutError as e:
        return fail(str(e), "timeout")
    except Exception as e:
        log.debug("tool %r raised", call.name, exc_info=True)
        return fail(f"tool {call.name!r} raised {type(e).__name__}: {e}", "exception")
    return ToolOutcome(call, content, None, None, time.perf_counter() - start, value)


async def execute_tool_calls(
    tools: Mapping[str, Tool] | Sequence[Tool],
    calls: Sequence[ToolCall | Mapping[str, Any]],
    *,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    parallel: bool = False,
) -> list[ToolOutcome]:
    """Run ``calls`` (ToolCalls or OpenAI ``tool_calls`` dicts) and return one outcome per call,
    in order. Model faults become outcomes with ``error_kind`` set; nothing here raises for them.

    ``timeout`` (seconds, None for none) applies to each call unless the tool set its own.
    Calls run one after another (tools may share state) unless ``parallel`` is true.
    """
    registry = _registry(tools)
    if parallel:
        return list(await asyncio.gather(*(_execute_one(registry, c, timeout) for c in calls)))
    return [await _execute_one(registry, c, timeout) for c in calls]
