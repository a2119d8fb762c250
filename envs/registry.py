"""Env registry on top of gymnasium's: ``register``, ``make`` and discovery of third-party
packages through the entry-point group ``vime.envs``."""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import types
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium

from vime.errors import EnvError

ENTRY_POINT_GROUP = "vime.envs"

_plugins_loaded = False
plugin_errors: dict[str, str] = {}
"""Entry points of group ``vime.envs`` that failed to load: name -> error text."""


def register(id: str, entry_point: str | Callable[..., gymnasium.Env], **defaults: Any) -> None:
    """Register env ``id`` (``namespace/Name-vN``) made by ``entry_point`` with ``defaults``.

    ``entry_point`` is a class or factory, or its ``"module:attr"`` path (imported on first
    ``make``). ``defaults`` are keyword arguments of the constructor that ``make`` can override.
    The env goes into gymnasium's registry, so ``gymnasium.make(id)`` works too; gymnasium's
    checker and order-enforcing wrappers are off so the env keeps its async API (run
    ``vime env check`` instead).
    """
    gymnasium.register(
        id=id,
        entry_point=entry_point,
        kwargs=defaults,
        order_enforce=False,
        disable_env_checker=True,
    )


def load_plugins(*, force: bool = False) -> dict[str, str]:
    """Load the ``vime.envs`` entry points of installed packages (once, or again if ``force``).

    An entry point names a module (importing it registers its envs) or a callable (called with
    no arguments). A plugin that fails is reported with a warning and recorded in
    :data:`plugin_errors`, which is returned; it never breaks the other envs.
    """
    global _plugins_loaded
    if _plugins_loaded and not force:
        return plugin_errors
    _plugins_loaded = True
    plugin_errors.clear()
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = ep.load()
            if isinstance(loaded, type):
                raise TypeError(
                    f"{ep.value} is a class; the entry point must name a module that registers "
                    f"its envs or a function that does"
                )
            if callable(loaded) and not isinstance(loaded, types.ModuleType):
                loaded()
        except Exception as exc:
            plugin_errors[ep.name] = f"{ep.value}: {type(exc).__name__}: {exc}"
            warnings.warn(
                f"env plugin {ep.name!r} ({ep.value}) failed to load: {exc}", stacklevel=2
            )
    return plugin_errors


def env_ids(*, include_gymnasium: bool = False) -> list[str]:
    """Registered ids (after loading plugins), sorted; gymnasium's own envs only if asked."""
    load_plugins()
    return sorted(
        i for i, s in gymnasium.registry.items() if include_gymnasium or not _is_gymnasiums(s)
    )


def _is_gymnasiums(env_spec: gymnasium.envs.registration.EnvSpec) -> bool:
    entry = env_spec.entry_point
    module = entry if isinstance(entry, str) else getattr(entry, "__module__", "")
    return module.startswith(("gymnasium.", "shimmy."))


def spec(id: str) -> gymnasium.envs.registration.EnvSpec:
    """The spec of ``id``; ``"module:id"`` imports ``module`` first (it registers the env).

    An unknown id raises :class:`EnvError` naming the closest registered ids.
    """
    if ":" in id:
        module, id = id.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EnvError(
                f"cannot import module {module!r} to find env {id!r}: {exc}. Is it on the "
                f"Python path (run from its folder or pip install its package)?"
            ) from exc
    load_plugins()
    if id in gymnasium.registry:
        return gymnasium.registry[id]
    ours = env_ids()
    close = difflib.get_close_matches(id, ours, n=5, cutoff=0.5) or difflib.get_close_matches(
        id, env_ids(include_gymnasium=True), n=5, cutoff=0.6
    )
    hint = f"Closest registered ids: {', '.join(close)}." if close else f"Registered: {ours}."
    failed = "".join(f" Plugin {n!r} failed to load ({e})." for n, e in plugin_errors.items())
    raise EnvError(f"unknown env id {id!r}. {hint}{failed} See 'vime env list'.")


def make(id: str, *, max_turns: int | None = None, **kwargs: Any) -> gymnasium.Env:
    """Make env ``id`` with ``kwargs`` over its registered defaults.

    ``max_turns`` wraps it in :class:`vime.envs.wrappers.MaxTurns` (truncation after that many
    steps). ``id`` may be ``"module:namespace/Name-vN"`` to import the module that registers it.
    """
    env_spec = spec(id)
    try:
        env = gymnasium.make(env_spec, **kwargs)
    except TypeError as exc:
        raise EnvError(f"cannot make {env_spec.id} with arguments {kwargs}: {exc}") from exc
    if max_turns is not None:
        from vime.envs.wrappers import MaxTurns

        env = MaxTurns(env, max_turns)
    return env
