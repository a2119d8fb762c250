"""Helpers shared by subcommand modules."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterable
from typing import Any


def add_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    runner: str,
    *,
    help: str,
    accepts: Iterable[str] = (),
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """Add a subcommand whose ``run`` is ``runner`` ("module:function"), imported when used.

    ``accepts`` lists the forwarded flag families the command takes: ``"vllm"``,
    ``"router"`` and ``"passthrough"`` (any other unknown flag, e.g. Megatron's).
    """
    kwargs.setdefault("allow_abbrev", False)  # an abbreviation would hide a forwarded flag
    parser = subparsers.add_parser(name, help=help, description=help, **kwargs)

    def run(args: argparse.Namespace) -> int:
        module, func = runner.split(":")
        return getattr(importlib.import_module(module), func)(args)

    parser.set_defaults(_run=run, _parser=parser, _accepts=frozenset(accepts))
    return parser
