"""``vime eval``: n samples per task of an env from any OpenAI-compatible model (a running
endpoint, or vLLM engines Vime starts), with resumable results, pass@k/maj@k and reports."""

from __future__ import annotations

import argparse

from vime.cli.common import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``vime eval`` (accepts --vllm-* and --router-* flags for the engines of --serve)."""
    from vime.config.schema import add_options
    from vime.eval.config import API_KEY_VARS, EvalConfig
    from vime.inference.config import ServeConfig
    from vime.inference.sampling import SamplingConfig

    parser = add_command(
        subparsers,
        "eval",
        "vime.cli.eval_cmd:run",
        help="Evaluate a model on an env: n samples per task, pass@k, maj@k, reports.",
        accepts=("vllm", "router"),
        epilog="Examples: vime eval --env vime/Math-v0 --serve $(vime model smollm2) --n 8 "
        "--k 1,4,8 --num-tasks 16 --output runs/math --vllm-max-model-len 1024 "
        "--vllm-enforce-eager | vime eval --env vime/Math-v0 --base-url https://host/v1 "
        f"--model NAME --output runs/remote (API key from ${' or $'.join(API_KEY_VARS)})",
    )
    add_options(parser, EvalConfig, "eval")
    add_options(parser, SamplingConfig, "sampling")
    model = parser.add_argument_group(
        "model (one of --base-url with --model, or --serve)",
        f"The API key of --base-url is read from ${' or $'.join(API_KEY_VARS)}, never a flag.",
    )
    model.add_argument("--base-url", help="a running OpenAI-compatible endpoint (…/v1)")
    model.add_argument("--model", help="model name at --base-url")
    model.add_argument("--serve", metavar="MODEL_PATH", help="start vLLM engines for this model")
    add_options(parser, ServeConfig, "engines (with --serve)", exclude={"model"})


def run(args: argparse.Namespace) -> int:
    """Serve the model (or use --base-url), run or resume the eval, print the summary."""
    import asyncio
    import os
    import sys

    from vime.config.schema import build
    from vime.errors import ConfigError
    from vime.eval.config import API_KEY_VARS, EvalConfig
    from vime.eval.runner import evaluate, prepare
    from vime.inference.sampling import SamplingConfig

    config = build(EvalConfig, args, sampling=build(SamplingConfig, args))
    if bool(args.base_url) == bool(args.serve):
        raise ConfigError("give either --base-url URL with --model NAME, or --serve MODEL_PATH")
    if args.base_url:
        if not args.model:
            raise ConfigError(f"--base-url {args.base_url} needs --model NAME (the served name)")
        if args.vllm_args or args.router_args:
            prefix, forwarded = (
                ("--vllm-", args.vllm_args) if args.vllm_args else ("--router-", args.router_args)
            )
            flag = prefix + forwarded[0].split("=", 1)[0][2:]
            raise ConfigError(f"{flag} only applies with --serve (Vime starts no engine here)")
        api_key = next((os.environ[v] for v in API_KEY_VARS if os.environ.get(v)), "EMPTY")
        summary = asyncio.run(
            evaluate(config, base_url=args.base_url, model=args.model, api_key=api_key)
        )
    else:
        if args.model:
            raise ConfigError("--model names the model at --base-url; with --serve leave it out")
        from vime.inference.config import ServeConfig
        from vime.inference.service import InferenceService

        serve = build(
            ServeConfig,
            args,
            model=args.serve,
            vllm_args=args.vllm_args,
            router_args=args.router_args,
        )
        prepared = prepare(config, serve.model)  # a refused output dir starts no engine
        service = InferenceService(serve)
        print(
            f"vime: starting engines for {serve.model} (logs in {service.log_dir})", file=sys.stderr
        )
        with service:
            summary = asyncio.run(
                evaluate(
                    config, base_url=service.base_url, model=service.model_name, prepared=prepared
                )
            )
    _print_summary(summary, config.output)
    return 0


def _print_summary(summary: dict, output: str) -> None:
    import shlex
    import sys

    names = [k for k in summary if k.startswith(("pass@", "maj@")) and not k.endswith("_ci")]
    parts = [f"{k} {summary[k]:.4f}" for k in [*names, "mean_reward"] if summary[k] is not None]
    print(
        f"vime: {summary['num_tasks']} tasks x {summary['n']} samples: {', '.join(parts)}; "
        f"{summary['num_failed']} failed {summary['failures'] or ''}",
        file=sys.stderr,
    )
    print(f"vime: wrote {output}/summary.json, report.md, report.html", file=sys.stderr)
    print(f"vime: browse the samples: vime view {shlex.quote(output)}", file=sys.stderr)
