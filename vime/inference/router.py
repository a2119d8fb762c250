"""vllm-router in front of the engines: its command line and its worker-management calls.

The router keeps a session on one engine (``consistent_hash`` on the ``X-Session-Id``
header). Workers are only ever added once healthy, because ``/add_worker`` blocks for the
router's startup timeout on a URL that does not answer.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import httpx

from vime.config.passthrough import has_flag
from vime.inference.errors import InferenceError
from vime.inference.processes import free_port

SESSION_HEADER = "X-Session-Id"


def router_executable() -> str:
    """The ``vllm-router`` command (next to this Python first, then on PATH)."""
    beside = Path(sys.executable).with_name("vllm-router")
    if beside.is_file():
        return str(beside)
    found = shutil.which("vllm-router")
    if found is None:
        raise InferenceError(
            "the vllm-router command was not found; install it with: pip install vllm-router"
        )
    return found


def router_argv(host: str, port: int, workers: list[str], extra: list[str]) -> list[str]:
    """The router's command line; ``extra`` (the --router-* flags) override the defaults."""
    argv = [router_executable(), "--host", host, "--port", str(port)]
    if workers:
        argv += ["--worker-urls", *workers]
    defaults = {
        "--policy": ["consistent_hash"],
        # Workers are added only once healthy; a short timeout bounds a bad add.
        "--worker-startup-timeout-secs": ["30"],
        "--log-level": ["warning"],
        # The router's metrics port is fixed (29000) by default, so a second router on the
        # same machine would die at start: give each one a free port.
        "--prometheus-port": [str(free_port(host))],
    }
    for flag, values in defaults.items():
        if not has_flag(extra, flag):
            argv += [flag, *values]
    return argv + list(extra)


def add_worker(router_url: str, worker_url: str, timeout: float = 60.0) -> None:
    """Register a healthy engine with the router."""
    r = httpx.post(f"{router_url}/add_worker", params={"url": worker_url}, timeout=timeout)
    if r.status_code >= 400 and "already" not in r.text.lower():
        raise InferenceError(f"router refused worker {worker_url}: {r.status_code} {r.text}")


def remove_worker(router_url: str, worker_url: str, timeout: float = 10.0) -> None:
    """Take an engine out of the router (no error if it was not there)."""
    httpx.post(f"{router_url}/remove_worker", params={"url": worker_url}, timeout=timeout)


def list_workers(router_url: str, timeout: float = 5.0) -> list[str]:
    """The worker URLs the router currently sends requests to."""
    r = httpx.get(f"{router_url}/list_workers", timeout=timeout)
    r.raise_for_status()
    data = r.json()
    urls = data.get("urls", data.get("workers", [])) if isinstance(data, dict) else data
    return [u if isinstance(u, str) else u.get("url", "") for u in urls]
