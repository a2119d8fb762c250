"""``vime sandbox serve``: run the sandbox server so env workers elsewhere can run code here."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from vime.cli.common import add_command
from vime.config.schema import add_options, build
from vime.sandboxes.server_config import ServerConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``vime sandbox serve``."""
    parser = subparsers.add_parser(
        "sandbox", help="Sandbox server for running code.", description="Sandbox server."
    )
    sub = parser.add_subparsers(dest="sandbox_command", metavar="SANDBOX_COMMAND", required=True)
    serve = add_command(
        sub,
        "serve",
        "vime.cli.sandbox_cmd:run_serve",
        help="Serve sandboxes (local or docker backend) over HTTP to clients with the token "
        "(backend 'remote' of vime.sandboxes.create).",
    )
    add_options(serve, ServerConfig, "server")


def run_serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM, then close every sandbox."""
    from vime.sandboxes.server import serve

    config = build(ServerConfig, args)
    config.token()  # a missing token is a usage error before anything starts

    def ready(url: str) -> None:
        print(f"vime sandbox server ({config.backend}) listening on {url}", flush=True)

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await serve(config, ready=ready)
        except asyncio.CancelledError:
            print("vime sandbox server stopped; sandboxes closed", file=sys.stderr)

    asyncio.run(main())
    return 0
