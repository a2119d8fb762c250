"""``vime train``: the RL loop (rollouts, training, weight sync) on a local or remote Ray cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

from vime.cli.common import add_command

QUICKSTART = Path(__file__).resolve().parents[1] / "orchestration" / "presets" / "quickstart.yaml"

# Options that one run-level flag sets for several components.
SHARED = {"seed", "model", "hf_checkpoint", "rollout_temperature", "vllm_args", "router_args"}


def _config_classes() -> list[tuple[str, type, str]]:
    from vime.agents.config import AgentConfig
    from vime.algorithms.config import AdvantageConfig, LossConfig
    from vime.inference.config import ServeConfig
    from vime.orchestration.config import RunConfig
    from vime.rollout.config import RolloutConfig
    from vime.training.base import TrainerConfig

    return [
        ("run", RunConfig, "run"),
        ("rollout", RolloutConfig, "rollouts"),
        ("agent", AgentConfig, "agent loop"),
        ("serve", ServeConfig, "inference engines and router"),
        ("trainer", TrainerConfig, "trainer"),
        ("loss", LossConfig, "policy loss"),
        ("advantage", AdvantageConfig, "advantages"),
    ]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``vime train``."""
    from vime.config.schema import add_options

    parser = add_command(
        subparsers,
        "train",
        "vime.cli.train_cmd:run",
        help="Train a policy with RL: rollouts in vLLM, updates in the trainer, weights synced back.",
        accepts=("vllm", "router", "passthrough"),
    )
    parser.add_argument(
        "--quickstart",
        action="store_true",
        help=f"the CPU quickstart preset ({QUICKSTART.name}); other flags override it",
    )
    for name, cls, title in _config_classes():
        add_options(parser, cls, title, exclude=set() if name == "run" else SHARED)


def build_setup(args: argparse.Namespace):
    """The typed configs of every component from parsed arguments."""
    from dataclasses import replace

    from vime.config.schema import build
    from vime.errors import ConfigError
    from vime.orchestration.setup import TrainSetup

    parts = {}
    for name, cls, _ in _config_classes():
        overrides = {}
        if name == "rollout":
            overrides["seed"] = args.seed if hasattr(args, "seed") else 0
            overrides["env_kwargs"] = _env_kwargs(getattr(args, "env_kwargs", None))
        if name == "serve":
            overrides.update(
                model=getattr(args, "model", ""),
                vllm_args=args.vllm_args,
                router_args=args.router_args,
            )
        if name == "trainer":
            overrides.update(
                hf_checkpoint=getattr(args, "model", ""),
                seed=getattr(args, "seed", 0),
                rollout_temperature=getattr(args, "rollout_temperature", 1.0),
            )
        parts[name] = build(cls, args, **overrides)
    if args.passthrough_args and parts["trainer"].backend != "megatron":
        from vime.cli.main import _unknown_flag_error

        err = _unknown_flag_error(args._parser, args.passthrough_args)
        raise ConfigError(f"{err} (Megatron's own flags are accepted only with --backend megatron)")
    if parts["run"].mode == "async" and parts["loss"].tis_cap is None:
        # Async rollouts are off-policy by up to --max-staleness versions: correct for it.
        parts["loss"] = replace(parts["loss"], tis_cap=2.0)
    return TrainSetup(megatron_args=list(args.passthrough_args), **parts)


def _env_kwargs(text: str | None) -> dict:
    import json

    from vime.errors import ConfigError

    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--env-kwargs {text!r} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--env-kwargs must be a JSON object, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Entry point of ``vime train``."""
    from vime.orchestration.run import run_training

    run_training(build_setup(args))
    return 0
