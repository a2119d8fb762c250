"""Lazy package exports: a name is imported from its module the first time it is used.

Packages use this so that ``import vime`` (or ``vime.algorithms``, ``vime.training.megatron``)
stays fast and never pulls in torch, vLLM, Ray or Megatron before they are needed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, table: dict[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` that resolves ``table[name]`` (a module path) on first use.

    The resolved value is cached in ``namespace`` (the package's ``globals()``), so later
    lookups never reach ``__getattr__`` again.
    """

    def __getattr__(name: str) -> Any:
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
