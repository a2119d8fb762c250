"""JSON Schema for a tool's parameters, generated from its signature, type hints and docstring
(pydantic builds the validators; ``$ref``s are inlined so small models read plain schemas)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

import docstring_parser
import typing_extensions
from pydantic import TypeAdapter


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a tool: its validator and how it is passed."""

    name: str
    adapter: TypeAdapter
    required: bool
    default: Any
    positional_only: bool
    rejects_bool: bool  # numbers only: pydantic's lax mode would turn true into 1


def _typed_dict_compatible(tp: Any) -> Any:
    """Rewrite typing.TypedDict classes (which pydantic refuses on Python < 3.12) inside ``tp``."""
    if sys.version_info < (3, 12) and typing.is_typeddict(tp):
        fields = {}
        for k, v in typing.get_type_hints(tp, include_extras=True).items():
            if typing.get_origin(v) in (typing.Required, typing.NotRequired):
                v = typing.get_args(v)[0]
            v = _typed_dict_compatible(v)
            fields[k] = v if k in tp.__required_keys__ else typing_extensions.NotRequired[v]
        new = typing_extensions.TypedDict(tp.__name__, fields)  # type: ignore[operator]
        new.__doc__, new.__module__ = tp.__doc__, tp.__module__
        return new
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if not args or origin is Literal:
        return tp
    if origin is typing.Annotated:
        return typing.Annotated[(_typed_dict_compatible(args[0]), *tp.__metadata__)]
    new_args = tuple(_typed_dict_compatible(a) for a in args)
    if new_args == args:
        return tp
    if origin in (typing.Union, types.UnionType):
        return typing.Union[new_args]  # noqa: UP007 (rebuilding a union from a tuple)
    return origin[new_args]


def _is_method(fn: Callable[..., Any], params: list[inspect.Parameter]) -> bool:
    """A function written in a class body whose first parameter is ``self``/``cls``."""
    parts = getattr(fn, "__qualname__", "").split(".")
    in_class = len(parts) >= 2 and parts[-2] != "<locals>"
    return in_class and bool(params) and params[0].name in ("self", "cls")


def _accepts_bool(schema: dict[str, Any]) -> bool:
    kinds = [schema.get("type")] + [s.get("type") for s in schema.get("anyOf", [])]
    numeric = any(k in ("integer", "number") for k in kinds)
    return not numeric or "boolean" in kinds


class _SchemaTidier:
    """Inline ``$ref``s (except for recursive types, which keep ``$defs``) and drop ``title``s."""

    _MAPS = ("properties", "patternProperties", "$defs", "dependentSchemas")
    _LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
    _SINGLE = ("items", "additionalProperties", "not", "contains", "if", "then", "else")

    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs
        self.kept: dict[str, Any] = {}

    def tidy(self, node: Any, stack: frozenset[str] = frozenset()) -> Any:
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            key = ref.removeprefix("#/$defs/")
            if key not in stack and key in self.defs:
                merged = {**self.defs[key], **{k: v for k, v in node.items() if k != "$ref"}}
                return self.tidy(merged, stack | {key})
            if key not in self.kept:
                self.kept[key] = None  # placeholder: breaks the recursion
                self.kept[key] = self.tidy(self.defs[key], frozenset({key}))
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k == "title":
                continue
            if k in self._MAPS and isinstance(v, dict):
                out[k] = {name: self.tidy(s, stack) for name, s in v.items()}
            elif k in self._LISTS and isinstance(v, list):
                out[k] = [self.tidy(s, stack) for s in v]
            elif k in self._SINGLE:
                out[k] = self.tidy(v, stack)
            else:
                out[k] = v
        return out


def underlying(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function whose annotations, docstring and async-ness describe the callable ``fn``."""
    if isinstance(fn, functools.partial):
        return underlying(fn.func)
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        return fn
    return type(fn).__call__


def describe_parameters(
    fn: Callable[..., Any], name: str
) -> tuple[dict[str, Any], list[Param], bool, Any]:
    """The JSON Schema of ``fn``'s parameters, their validators and whether ``fn`` is a method."""
    target = underlying(fn)
    params = list(inspect.signature(fn).parameters.values())
    is_method = _is_method(fn, params)
    if is_method:
        params = params[1:]
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception as e:
        raise TypeError(
            f"cannot resolve the type annotations of tool {name!r}: {e}. Define the types the "
            "annotations name at module level (local classes cannot be resolved under "
            "`from __future__ import annotations`)."
        ) from e
    doc = docstring_parser.parse(inspect.getdoc(target) or inspect.getdoc(fn) or "")
    param_docs = {p.arg_name: p.description for p in doc.params if p.description}
    for key, hint in hints.items():  # Annotated[int, "what it is"] wins over the docstring
        if typing.get_origin(hint) is typing.Annotated:
            notes = [m for m in hint.__metadata__ if isinstance(m, str)]
            if notes:
                param_docs[key] = " ".join(notes)

    built: list[Param] = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(
                f"tool {name!r}: *args/**kwargs ({p.name!r}) cannot be described to a model; "
                "list the parameters explicitly"
            )
        if p.name not in hints:
            raise TypeError(
                f"tool {name!r}: parameter {p.name!r} has no type annotation; "
                f"annotate it (e.g. `{p.name}: str`)"
            )
        try:
            adapter = TypeAdapter(_typed_dict_compatible(hints[p.name]))
            adapter.json_schema()
        except Exception as e:
            raise TypeError(
                f"tool {name!r}: the type of parameter {p.name!r} ({hints[p.name]!r}) cannot be "
                f"validated or described as JSON Schema: {e}"
            ) from e
        built.append(
            Param(
                p.name, adapter, p.default is p.empty, p.default, p.kind == p.POSITIONAL_ONLY, True
            )
        )

    by_key, top = TypeAdapter.json_schemas([(p.name, "validation", p.adapter) for p in built])
    tidier = _SchemaTidier(top.get("$defs", {}))
    properties: dict[str, Any] = {}
    for i, p in enumerate(built):
        raw = dict(by_key[(p.name, "validation")])
        if p.name in param_docs:
            raw.setdefault("description", param_docs[p.name])
        if not p.required:
            try:
                raw["default"] = p.adapter.dump_python(p.default, mode="json")
            except Exception:
                raw.pop("default", None)  # not JSON-expressible; the schema simply omits it
        properties[p.name] = tidier.tidy(raw)
        built[i] = dataclasses.replace(p, rejects_bool=not _accepts_bool(properties[p.name]))
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    required = [p.name for p in built if p.required]
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    if tidier.kept:
        schema["$defs"] = tidier.kept
    return schema, built, is_method, doc
