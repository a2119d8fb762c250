"""``vime rollout``: play episodes of an env with a model and write them as JSONL, so env
writers can watch a model play their env before training."""

from __future__ import annotations

import argparse

from vime.cli.common import add_command
from vime.config.schema import add_options


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``vime rollout`` (accepts --vllm-* and --router-* flags for the engines it starts)."""
    from vime.agents.config import AgentConfig
    from vime.inference.config import ServeConfig
    from vime.inference.sampling import SamplingConfig
    from vime.rollout.config import RolloutConfig

    parser = add_command(
        subparsers,
        "rollout",
        "vime.cli.rollout_cmd:run",
        help="Play episodes of an env with a model and write their trajectories as JSONL.",
        accepts=("vllm", "router"),
        epilog="Example: vime rollout --env vime/Math-v0 --model $(vime model smollm2) --n 4 "
        "--num-tasks 8 --output rollout.jsonl --vllm-max-model-len 2048 --vllm-enforce-eager",
    )
    io = parser.add_argument_group("rollout input and output")
    io.add_argument("--output", required=True, help="JSONL file to write (one trajectory a line)")
    io.add_argument("--tasks", help="JSONL/Parquet task rows (each with an 'id'), one group each")
    io.add_argument(
        "--num-tasks",
        type=int,
        default=None,
        help="groups to play (default: every row of --tasks, else 4 tasks drawn by the env)",
    )
    io.add_argument(
        "--base-url",
        help="use this running OpenAI-compatible vLLM endpoint (…/v1) instead of starting engines",
    )
    io.add_argument("--served-model-name", help="model name at --base-url (default: its first)")
    io.add_argument(
        "--model",
        help="HF model folder (or name): the engines Vime starts serve it; with --base-url, the "
        "tokenizer of --agent-mode tokens comes from it (required unless --base-url with "
        "--agent-mode chat)",
    )
    add_options(parser, SamplingConfig, "sampling")
    add_options(parser, RolloutConfig, "rollout")
    add_options(parser, AgentConfig, "agent")
    add_options(
        parser, ServeConfig, "engines (when Vime serves the model)", exclude=frozenset({"model"})
    )


def run(args: argparse.Namespace) -> int:
    """Serve the model (or use --base-url), play the episodes, write the JSONL."""
    import asyncio
    import sys
    from pathlib import Path

    from vime.agents.config import AgentConfig
    from vime.config.schema import build
    from vime.errors import ConfigError
    from vime.inference.sampling import SamplingConfig
    from vime.rollout.config import RolloutConfig

    rollout = build(RolloutConfig, args)
    agent = build(AgentConfig, args)
    sampling = build(SamplingConfig, args)
    _check_model(args, agent.mode)
    tasks = _tasks(args)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("")
    if args.base_url:
        name = args.served_model_name or asyncio.run(_first_model(args.base_url))
        return asyncio.run(
            _play(args, rollout, agent, sampling, tasks, args.base_url, name, output)
        )
    from vime.inference.config import ServeConfig
    from vime.inference.service import InferenceService

    if args.served_model_name:
        raise ConfigError("--served-model-name only applies with --base-url")
    serve = build(ServeConfig, args, vllm_args=args.vllm_args, router_args=args.router_args)
    service = InferenceService(serve)
    print(f"vime: starting engines for {serve.model} (logs in {service.log_dir})", file=sys.stderr)
    with service.start():
        return asyncio.run(
            _play(
                args, rollout, agent, sampling, tasks, service.base_url, service.model_name, output
            )
        )


def _check_model(args: argparse.Namespace, mode: str) -> None:
    """--model is needed to start engines, and for the tokenizer of token-in mode."""
    from vime.errors import ConfigError

    if args.model:
        return
    if not args.base_url:
        raise ConfigError(
            "vime rollout needs --model (the HF model folder the engines serve), or --base-url "
            "of running engines"
        )
    if mode == "tokens":
        raise ConfigError(
            f"--base-url {args.base_url} without --model: --agent-mode tokens renders the chat "
            "template here and needs the model's tokenizer; give --model (the folder the "
            "engines at --base-url serve) or use --agent-mode chat"
        )


def _tasks(args: argparse.Namespace) -> list:
    from vime.errors import ConfigError

    if args.num_tasks is not None and args.num_tasks < 1:
        raise ConfigError(f"--num-tasks must be >= 1, got {args.num_tasks}")
    if args.tasks:
        from vime.data import load_tasks

        rows = load_tasks(args.tasks)
        return rows[: args.num_tasks] if args.num_tasks else rows
    return list(range(args.num_tasks or 4))


async def _first_model(base_url: str) -> str:
    import aiohttp

    from vime.errors import ConfigError

    try:
        async with aiohttp.ClientSession() as http, http.get(base_url.rstrip("/") + "/models") as r:
            data = await r.json()
        return data["data"][0]["id"]
    except (aiohttp.ClientError, KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"cannot list the models at --base-url {base_url} ({exc!r}); check the URL (it ends "
            "in /v1) or give --served-model-name"
        ) from exc


def _renderer(args: argparse.Namespace, mode: str):
    """The chat-template renderer of the model's tokenizer (token-in mode only)."""
    if mode != "tokens":
        return None
    from transformers import AutoTokenizer

    from vime.agents import ChatTemplateRenderer
    from vime.errors import ConfigError

    try:
        return ChatTemplateRenderer(AutoTokenizer.from_pretrained(args.model))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot load the tokenizer of --model {args.model!r} for token-in mode ({exc}); "
            "give a local model folder or use --agent-mode chat"
        ) from exc


async def _play(args, rollout, agent, sampling, tasks, base_url: str, model: str, output) -> int:
    import sys

    from tqdm import tqdm

    from vime.eval.scoring import score
    from vime.inference.client import VimeClient
    from vime.rollout import RolloutManager, write_jsonl

    client = VimeClient(base_url, model=model)
    bar = tqdm(total=len(tasks) * rollout.n, unit="episode", file=sys.stderr)

    def done(trajectory) -> None:
        bar.update(1)
        bar.set_postfix(reward=f"{trajectory.reward:.2f}", status=str(trajectory.status))

    manager = RolloutManager(
        rollout, lambda: client, agent, renderer=_renderer(args, agent.mode), on_trajectory=done
    )
    try:
        batch = await manager.generate(tasks, sampling)
    finally:
        bar.close()
        await client.close()
    for kept, groups in ((True, batch.groups), (False, batch.dropped)):
        for group in groups:
            write_jsonl(group, output, group_kept=kept)
    m = batch.metrics
    summary = score([t for g in batch.groups + batch.dropped for t in g])
    print(
        f"vime: {int(m['episodes'])} episodes ({int(m['status/completed'])} completed, "
        f"{int(m['status/truncated'])} truncated, {int(m['status/failed'])} failed), "
        f"{int(m['turns'])} turns, pass@1 {summary['pass@1']:.4f}, mean reward "
        f"{summary['mean_reward']:.4f}, drift {int(m['drift_count'])}; wrote {output}",
        file=sys.stderr,
    )
    return 0
