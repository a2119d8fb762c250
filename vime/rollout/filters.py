"""Dynamic-sampling hooks: a group filter decides whether a finished group of trajectories is
kept for training. Hooks are plain callables, loadable by dotted path."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

from vime.errors import ConfigError
from vime.types import Status, Trajectory

GroupFilter = Callable[[Sequence[Trajectory]], bool]


def keep_all(group: Sequence[Trajectory]) -> bool:
    """Keep every group."""
    return True


def nonzero_reward_variance(group: Sequence[Trajectory]) -> bool:
    """Keep groups whose rewards are not all equal (they carry a learning signal under GRPO)."""
    rewards = [t.reward for t in group]
    return len(rewards) > 1 and max(rewards) > min(rewards)


def no_failures(group: Sequence[Trajectory]) -> bool:
    """Keep groups in which no episode failed or was aborted."""
    return all(t.status not in (Status.FAILED, Status.ABORTED) for t in group)


BUILTIN: dict[str, GroupFilter] = {
    "keep_all": keep_all,
    "nonzero_reward_variance": nonzero_reward_variance,
    "no_failures": no_failures,
}


def load_hook(spec: str | Callable | None) -> Callable:
    """The callable named by ``spec``: a built-in filter name, ``"pkg.module:attr"`` or
    ``"pkg.module.attr"``; a callable is returned as is and None means :func:`keep_all`."""
    if spec is None:
        return keep_all
    if callable(spec):
        return spec
    if spec in BUILTIN:
        return BUILTIN[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(
            f"hook {spec!r} is neither a built-in ({', '.join(BUILTIN)}) nor a dotted path "
            "like 'my_pkg.filters:keep_hard'"
        )
    try:
        hook = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load hook {spec!r}: {exc}") from exc
    if not callable(hook):
        raise ConfigError(f"hook {spec!r} is a {type(hook).__name__}, not a callable")
    return hook
