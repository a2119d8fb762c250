"""``vime view``: a train run, an eval or a rollout file as one self-contained HTML page
(curves, filters, messages, tokens), or served locally with ``--serve``."""

from __future__ import annotations

import argparse

from vime.cli.common import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``vime view``."""
    parser = add_command(
        subparsers,
        "view",
        "vime.cli.view_cmd:run",
        help="Browse a train run, an eval or a rollout JSONL: curves, trajectories, tokens.",
        epilog="Examples: vime view runs/quickstart (writes runs/quickstart/view.html) | "
        "vime view runs/math-eval --serve --port 8765 | vime view rollout.jsonl --tokenizer "
        "$(vime model smollm2)",
    )
    parser.add_argument(
        "path", help="a vime train --output-dir, a vime eval --output dir, or a rollout JSONL file"
    )
    parser.add_argument(
        "--output",
        help="HTML file to write (default: view.html in the run dir, X.html beside X.jsonl)",
    )
    parser.add_argument(
        "--tokenizer",
        help="model folder (or tokenizer.json) to show token ids as text (default: the train "
        "run's model; without one the token view shows ids)",
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="serve the page on localhost instead of writing a file (episodes load on demand)",
    )
    parser.add_argument("--port", type=int, default=8765, help="port of --serve (0: any free one)")
    parser.add_argument("--host", default="127.0.0.1", help="address of --serve")


def run(args: argparse.Namespace) -> int:
    """Write the page, or serve it until interrupted."""
    import os
    import sys
    import time

    from vime.errors import ConfigError
    from vime.view import build, default_output

    if args.output and args.serve:
        raise ConfigError("--output writes a file and --serve serves the page: give one of them")
    if args.tokenizer and not os.path.exists(args.tokenizer):
        raise ConfigError(f"--tokenizer {args.tokenizer}: no such file or folder")
    started = time.monotonic()
    source, packed, pieces = build(args.path, tokenizer=args.tokenizer)
    if not args.serve:
        from vime.view.page import write_file

        out = write_file(args.output or default_output(args.path), source, packed, pieces)
        size = out.stat().st_size / 1e6
        print(
            f"vime: wrote {out} ({packed.count} episodes, {size:.1f} MB, "
            f"{time.monotonic() - started:.1f}s); open it in a browser",
            file=sys.stderr,
        )
        return 0
    from vime.view.serve import make_server

    try:
        server = make_server(source, packed, pieces, host=args.host, port=args.port)
    except OSError as exc:
        raise ConfigError(
            f"--port {args.port}: cannot listen on {args.host} ({exc.strerror}); pick another "
            "port or --port 0"
        ) from None
    host, port = server.server_address[:2]
    print(
        f"vime: serving {packed.count} episodes at http://{host}:{port}/ (Ctrl-C stops)",
        file=sys.stderr,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
