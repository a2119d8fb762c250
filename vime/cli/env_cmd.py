"""``vime env list | check ID | play ID``: browse, verify and hand-play environments."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from vime.cli.common import add_command
from vime.errors import ConfigError

ID_HELP = (
    "Env id such as vime/Math-v0 (see 'vime env list'); MODULE:ID imports MODULE first, "
    "from the current folder too (for an env you just wrote)."
)


def _add_env_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help=ID_HELP)
    parser.add_argument(
        "--kwarg",
        "-k",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Constructor argument of the env (VALUE parsed as JSON when it is JSON); repeatable.",
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the first episode.")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``vime env list``, ``vime env check`` and ``vime env play``."""
    parser = subparsers.add_parser(
        "env",
        help="List, check and play environments.",
        description="List, check and play environments.",
    )
    sub = parser.add_subparsers(dest="env_command", metavar="ENV_COMMAND", required=True)
    add_command(sub, "list", "vime.cli.env_cmd:run_list", help="List registered environments.")
    check = add_command(
        sub,
        "check",
        "vime.cli.env_cmd:run_check",
        help="Check an env: API shape, seeding, tool schemas, malformed actions, concurrent "
        "episodes, JSON observations, gymnasium's check_env. Exit status 1 if a check fails.",
    )
    _add_env_arguments(check)
    check.add_argument("--episodes", type=int, default=8, help="Concurrent episodes to compare.")
    play = add_command(
        sub,
        "play",
        "vime.cli.env_cmd:run_play",
        help="Play an env in the terminal: you type the assistant's turns (or pipe them in).",
    )
    _add_env_arguments(play)
    play.add_argument("--episodes", type=int, default=1, help="Episodes to play.")
    play.add_argument("--max-turns", type=int, default=None, help="Truncate after this many turns.")


def _kwargs(pairs: list[str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--kwarg expects KEY=VALUE, got {pair!r}")
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    return kwargs


def _importable_cwd(env_id: str) -> None:
    # A console script does not put the current folder on sys.path; MODULE:ID needs it.
    if ":" in env_id and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def run_list(args: argparse.Namespace) -> int:
    """Print the registered Vime and plugin envs (gymnasium's own envs are left out)."""
    import gymnasium

    from vime.envs.registry import env_ids, plugin_errors

    ids = env_ids()
    width = max((len(i) for i in ids), default=0)
    for env_id in ids:
        spec = gymnasium.registry[env_id]
        entry = (
            spec.entry_point
            if isinstance(spec.entry_point, str)
            else getattr(spec.entry_point, "__qualname__", repr(spec.entry_point))
        )
        defaults = f"  {spec.kwargs}" if spec.kwargs else ""
        print(f"{env_id:<{width}}  {entry}{defaults}")
    for name, error in plugin_errors.items():
        print(f"plugin {name!r} failed to load: {error}", file=sys.stderr)
    return 0


def run_check(args: argparse.Namespace) -> int:
    """Run the checks and print one line per check."""
    from vime.envs.checker import check
    from vime.envs.registry import spec

    _importable_cwd(args.id)
    spec(args.id)  # an unknown id is a usage error (exit 2, closest ids), not a failed check
    report = check(args.id, seed=args.seed, episodes=args.episodes, **_kwargs(args.kwarg))
    print(report.format())
    return 0 if report.ok else 1


def run_play(args: argparse.Namespace) -> int:
    """Play the env with the person at the terminal."""
    from vime.envs.play import play
    from vime.envs.registry import make

    _importable_cwd(args.id)
    env = make(args.id, max_turns=args.max_turns, **_kwargs(args.kwarg))
    try:
        play(env, seed=args.seed, episodes=args.episodes, title=args.id.split(":")[-1])
    finally:
        env.close()
    return 0
