"""``vime serve``: vLLM engines behind vllm-router until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse

from vime.cli.common import add_command
from vime.config.schema import add_options


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``vime serve`` (accepts --vllm-* and --router-* flags)."""
    from vime.inference.config import ServeConfig

    parser = add_command(
        subparsers,
        "serve",
        "vime.cli.serve_cmd:run",
        help="Serve a model with N vLLM engines behind vllm-router (OpenAI-compatible API).",
        accepts=("vllm", "router"),
        epilog="Example: vime serve --model $(vime model smollm2) --rollout-num-engines 2 "
        "--vllm-max-model-len 2048 --vllm-enforce-eager",
    )
    add_options(parser, ServeConfig, "serve")


def run(args: argparse.Namespace) -> int:
    """Start the service, print its address, and wait for a signal to stop it."""
    import signal
    import sys
    import threading

    from vime.config.schema import build
    from vime.inference.config import ServeConfig
    from vime.inference.service import InferenceService

    config = build(ServeConfig, args, vllm_args=args.vllm_args, router_args=args.router_args)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    service = InferenceService(config)
    print(
        f"vime: starting {config.rollout_num_engines} engine(s) for {config.model} "
        f"(logs in {service.log_dir})",
        file=sys.stderr,
        flush=True,
    )
    try:
        service.start()
        print(f"vime: engines: {' '.join(service.engine_urls)}", file=sys.stderr)
        print(f"vime: model name: {service.model_name}", file=sys.stderr)
        print(f"OpenAI base URL: {service.base_url}", flush=True)
        stop.wait()
        print("vime: stopping engines and router", file=sys.stderr, flush=True)
    finally:
        service.stop()
    return 0
