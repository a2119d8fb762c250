"""``vime train``: the RL loop (rollouts, training, weight sync) on a local or remote Ray cluster."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from vime.cli.common import add_command

if TYPE_CHECKING:
    from vime.orchestration.setup import TrainSetup

PRESETS = Path(__file__).resolve().parents[1] / "orchestration" / "presets"
QUICKSTART = PRESETS / "quickstart.yaml"
# Laid over the quickstart when --lora-rank is above 0: LoRA needs its own lr (README).
QUICKSTART_LORA = PRESETS / "quickstart_lora.yaml"
# Laid over the quickstart when it runs on a CPU without a native bf16 matmul.
QUICKSTART_FP32 = PRESETS / "quickstart_fp32.yaml"

# Options that one run-level flag sets for several components (see TrainSetup's views).
SHARED = {"seed", "model", "hf_checkpoint", "rollout_temperature", "vllm_args", "router_args"}

# Flags renamed when vime train, rollout and eval got one SamplingConfig.
RENAMED = {
    "--rollout-temperature": "--temperature",
    "--rollout-top-p": "--top-p",
    "--rollout-max-response-len": "--max-tokens",
}


def quickstart_configs(argv: list[str]) -> list[str]:
    """The ``--config`` flags of ``--quickstart``: the preset, plus its float32 overlay when
    the run is on a CPU that only emulates bf16, and its LoRA overlay when ``argv`` asks for
    LoRA (``--lora-rank`` above 0). Flags in ``argv`` still win."""
    import sys

    from vime.config.passthrough import flag_value

    configs = ["--config", str(QUICKSTART)]
    if _emulates_bf16(flag_value(argv, "--device") or "auto"):
        print(
            "vime: this CPU has no native bf16 matmul (AVX-512 BF16 or AMX), so the quickstart "
            f"computes in float32 ({QUICKSTART_FP32.name}); --dtype overrides",
            file=sys.stderr,
        )
        configs += ["--config", str(QUICKSTART_FP32)]
    rank = flag_value(argv, "--lora-rank")
    if rank is not None and rank.isdigit() and int(rank) > 0:
        configs += ["--config", str(QUICKSTART_LORA)]
    return configs


def _emulates_bf16(device: str) -> bool:
    """Whether a run on ``device`` (``--device``: auto, cpu or gpu) would compute on a CPU
    without a native bf16 matmul."""
    from vime.hardware import cpu_has_native_bf16

    if device == "gpu" or cpu_has_native_bf16():
        return False
    if device == "cpu":
        return True
    from vime.orchestration.cluster import detect_device

    return detect_device() == "CPU"


def _config_classes() -> list[tuple[str, type, str]]:
    from vime.agents.config import AgentConfig
    from vime.algorithms.config import AdvantageConfig, LossConfig
    from vime.inference.config import ServeConfig
    from vime.inference.sampling import SamplingConfig
    from vime.orchestration.config import RunConfig
    from vime.rollout.config import RolloutConfig
    from vime.training.base import TrainerConfig

    return [
        ("run", RunConfig, "run"),
        ("sampling", SamplingConfig, "sampling (of the rollouts; held-out evals are greedy)"),
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
        help=f"the CPU quickstart preset ({QUICKSTART.name}, and {QUICKSTART_LORA.name} "
        "with --lora-rank); other flags override it",
    )
    for name, cls, title in _config_classes():
        add_options(parser, cls, title, exclude=set() if name == "run" else SHARED)
    for old, new in RENAMED.items():
        parser.add_argument(
            old, action=_Renamed, new=new, default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )


class _Renamed(argparse.Action):
    """A flag that was renamed: using it is an error that names the new flag."""

    def __init__(self, *args, new: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from vime.errors import ConfigError

        raise ConfigError(
            f"{option_string} was renamed {self.new} (vime train, rollout and eval share one "
            f"set of sampling flags): use {self.new} {values}"
        )


def build_setup(args: argparse.Namespace) -> TrainSetup:
    """The typed configs of every component from parsed arguments."""
    from vime.config.schema import build
    from vime.errors import ConfigError
    from vime.orchestration.setup import TrainSetup

    parts = {}
    for name, cls, _ in _config_classes():
        overrides: dict = {}
        # The model, seed and env kwargs are set by TrainSetup from the run's flags (one
        # copy each, passed down as views).
        if name == "serve":
            overrides.update(model="", vllm_args=args.vllm_args, router_args=args.router_args)
        if name == "rollout":
            overrides["env_kwargs"] = {}
        parts[name] = build(cls, args, **overrides)
    if args.passthrough_args and parts["trainer"].backend != "megatron":
        from vime.cli.main import _unknown_flag_error

        err = _unknown_flag_error(args._parser, args.passthrough_args)
        raise ConfigError(f"{err} (Megatron's own flags are accepted only with --backend megatron)")
    return TrainSetup(megatron_args=list(args.passthrough_args), **parts)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``vime train``."""
    from vime.orchestration.run import run_training

    run_training(build_setup(args))
    return 0
