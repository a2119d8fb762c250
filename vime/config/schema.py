"""Typed configs as the single source of truth for command-line flags.

A component declares its options once, as a dataclass whose fields use :func:`option`;
:func:`add_options` generates the argparse flags from it and :func:`build` turns parsed
arguments back into the validated dataclass. ``__post_init__`` of a config raises
:class:`~vime.errors.ConfigError` naming the flags when values contradict each other.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Literal, TypeVar, get_args, get_origin

from vime.errors import ConfigError

T = TypeVar("T")


def option(default: Any = dataclasses.MISSING, help: str = "", **meta: Any) -> Any:
    """A config field with its help text; ``meta`` may set ``flag``, ``metavar`` or ``choices``."""
    kwargs: dict[str, Any] = {"metadata": {"help": help, **meta}}
    if isinstance(default, list | dict | set):
        kwargs["default_factory"] = lambda d=default: type(d)(d)
    elif default is not dataclasses.MISSING:
        kwargs["default"] = default
    return dataclasses.field(**kwargs)


def flag_name(field: dataclasses.Field) -> str:
    """The command-line flag of a config field (``max_turns`` -> ``--max-turns``)."""
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _argparse_kwargs(field: dataclasses.Field, tp: Any) -> dict[str, Any]:
    tp, _ = _unwrap_optional(tp)
    meta = field.metadata
    kwargs: dict[str, Any] = {"help": meta.get("help", ""), "dest": field.name}
    if "metavar" in meta:
        kwargs["metavar"] = meta["metavar"]
    if tp is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
        return kwargs
    origin = get_origin(tp)
    if origin is Literal:
        choices = list(get_args(tp))
        kwargs["choices"] = choices
        kwargs["type"] = type(choices[0])
    elif origin is list:
        (item,) = get_args(tp)
        kwargs["nargs"] = "+"
        kwargs["type"] = item
    else:
        kwargs["type"] = tp
    if "choices" in meta:
        kwargs["choices"] = meta["choices"]
    return kwargs


def add_options(
    parser: argparse._ActionsContainer,
    cls: type,
    title: str | None = None,
    *,
    exclude: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Add one flag per field of the config dataclass ``cls`` (in an argument group).

    Fields named in ``exclude`` get no flag: a command that composes several configs sets
    those itself (e.g. one ``--seed`` for every component).
    """
    group = parser.add_argument_group(title or cls.__name__, (cls.__doc__ or "").strip() or None)
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if not field.init or field.metadata.get("cli") is False or field.name in exclude:
            continue
        kwargs = _argparse_kwargs(field, hints[field.name])
        kwargs["default"] = argparse.SUPPRESS
        has_default = (
            field.default is not dataclasses.MISSING
            or field.default_factory is not dataclasses.MISSING
        )
        if has_default:
            default = (
                field.default
                if field.default is not dataclasses.MISSING
                else field.default_factory()  # type: ignore[misc]
            )
            kwargs["help"] = f"{kwargs['help']} (default: {default})".strip()
        else:
            kwargs["required"] = True
        group.add_argument(flag_name(field), **kwargs)


def build(cls: type[T], namespace: argparse.Namespace | dict[str, Any], **overrides: Any) -> T:
    """Build the config ``cls`` from parsed arguments (missing keys keep their defaults)."""
    values = vars(namespace) if isinstance(namespace, argparse.Namespace) else dict(namespace)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {k: v for k, v in values.items() if k in names}
    kwargs.update(overrides)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required option is missing
        raise ConfigError(f"{cls.__name__}: {exc}") from None
