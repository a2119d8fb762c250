"""``vime tasks repofix``: build task sets for the envs that need one."""

from __future__ import annotations

import argparse
from pathlib import Path

from vime.cli.common import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``vime tasks repofix``."""
    parser = subparsers.add_parser(
        "tasks", help="Build task sets.", description="Build task sets for envs that need one."
    )
    sub = parser.add_subparsers(dest="tasks_command", metavar="TASKS_COMMAND", required=True)
    repofix = add_command(
        sub,
        "repofix",
        "vime.cli.tasks_cmd:run_repofix",
        help="Build vime/RepoFix-v0 tasks from real packages: download each sdist, keep the "
        "tests that pass in the sandbox, inject one AST mutation per task and keep the mutants "
        "that a test catches. The same flags give the same task set.",
    )
    repofix.add_argument(
        "--packages",
        nargs="+",
        metavar="NAME==VERSION",
        default=None,
        help="Pure-Python packages whose sdists carry their tests (default: the shipped set's).",
    )
    repofix.add_argument("--out", type=Path, required=True, help="Folder to write the set to.")
    repofix.add_argument("--per-package", type=int, default=45, help="Tasks per package, at most.")
    repofix.add_argument("--seed", type=int, default=0, help="Seed of the mutant order.")
    repofix.add_argument(
        "--eval-fraction", type=float, default=0.2, help="Share of tasks held out for eval."
    )
    repofix.add_argument(
        "--backend", default="local", help="Sandbox backend that runs the tests (local, docker)."
    )
    repofix.add_argument(
        "--sdists", type=Path, default=None, help="Folder of sdists to use instead of downloading."
    )
    repofix.add_argument("--jobs", type=int, default=2, help="Packages built at once.")


def run_repofix(args: argparse.Namespace) -> int:
    """Build the set and print its table."""
    from vime.envs.repofix.build import DEFAULT_PACKAGES, build, table
    from vime.errors import ConfigError

    if args.per_package < 1 or args.jobs < 1:
        raise ConfigError(
            f"--per-package and --jobs must be >= 1, got {args.per_package} and {args.jobs}"
        )
    if args.out.exists() and any(args.out.iterdir()):
        raise ConfigError(f"--out {args.out} is not empty; give a new folder")
    reports = build(
        args.packages or DEFAULT_PACKAGES,
        args.out,
        per_package=args.per_package,
        seed=args.seed,
        eval_fraction=args.eval_fraction,
        backend=args.backend,
        sdists=args.sdists,
        jobs=args.jobs,
    )
    print(table(reports))
    print(f"wrote {args.out}")
    return 0
