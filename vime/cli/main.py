"""The ``vime`` command: one parser, subcommands registered by their own modules."""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys

from vime.config.passthrough import split_forwarded
from vime.config.yaml_file import expand_config_flag
from vime.errors import ConfigError, VimeError

# Each module defines ``register(subparsers)``; the subcommand's ``run(args) -> int`` is
# imported lazily so that ``vime --help`` never pays for torch, vllm or ray.
COMMAND_MODULES = [
    "vime.cli.env_cmd",
    "vime.cli.sandbox_cmd",
    "vime.cli.model_cmd",
    "vime.cli.serve_cmd",
    "vime.cli.rollout_cmd",
    "vime.cli.train_cmd",
    "vime.cli.eval_cmd",
    "vime.cli.tasks_cmd",
    "vime.cli.view_cmd",
]


def build_parser() -> argparse.ArgumentParser:
    """The full ``vime`` parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="vime",
        allow_abbrev=False,
        description="Vime: environment-centric agentic RL for LLMs, in the Gym style.",
        epilog=(
            "Flags named --vllm-X are forwarded to every vLLM engine as --X, --router-X to "
            "vllm-router as --X; with --backend megatron, Megatron's own flags pass "
            "through unchanged. --config FILE.yaml gives the same keys from a file."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # the subcommand is not part of this build
                continue
            raise
        module.register(sub)
    return parser


def _unknown_flag_error(parser: argparse.ArgumentParser, tokens: list[str]) -> ConfigError:
    flag = tokens[0].split("=", 1)[0]
    known = [s for a in parser._actions for s in a.option_strings]
    close = difflib.get_close_matches(flag, known, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return ConfigError(
        f"unrecognized argument {flag!r} for 'vime {parser.prog.split(' ', 1)[-1]}'.{hint} "
        f"See 'vime {parser.prog.split(' ', 1)[-1]} --help'."
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` (without the program name) into a namespace.

    Unrecognised ``--vllm-*``/``--router-*`` flags land in ``args.vllm_args`` and
    ``args.router_args`` for commands that start engines; other unknown flags land in
    ``args.passthrough_args`` for commands that accept them (Megatron), else are an error.
    """
    if argv and argv[0] == "train" and "--quickstart" in argv:
        from vime.cli.train_cmd import quickstart_configs

        argv = ["train", *quickstart_configs(argv[1:]), *argv[1:]]
    if argv and argv[0] in {"serve", "rollout", "train", "eval"}:
        argv = [argv[0], *expand_config_flag(argv[1:])]
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    sub_parser: argparse.ArgumentParser = getattr(args, "_parser", parser)
    forwarded = split_forwarded(unknown)
    accepts = getattr(args, "_accepts", frozenset())
    if forwarded.vllm and "vllm" not in accepts:
        raise _unknown_flag_error(sub_parser, forwarded.vllm)
    if forwarded.router and "router" not in accepts:
        raise _unknown_flag_error(sub_parser, forwarded.router)
    if forwarded.other and "passthrough" not in accepts:
        raise _unknown_flag_error(sub_parser, forwarded.other)
    args.vllm_args = forwarded.vllm
    args.router_args = forwarded.router
    args.passthrough_args = forwarded.other
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``vime`` console script; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
        if not getattr(args, "command", None) or not hasattr(args, "_run"):
            build_parser().print_help()
            return 0 if not argv else 2
        return int(args._run(args) or 0)
    except VimeError as exc:
        print(f"vime: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vime: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
