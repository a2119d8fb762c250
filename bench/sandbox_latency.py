"""Sandbox latency: p50/p99 of ``run_code("print(1)")`` and executions/s at concurrency 1, 8
and 32 for each available backend (local, docker, remote over loopback) beside a bare
subprocess doing the same work (write ``main.py``, run ``python3 main.py``), in one run. Prints
a table and writes JSON with ``--out FILE``.

    .venv/bin/python bench/sandbox_latency.py --runs 200 --out sandbox_latency.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vime.sandboxes import Sandbox, create
from vime.sandboxes.bwrap import PATH, find_launcher

CODE = "print(1)\n"
TARGET_LOCAL_VS_BARE = 1.6  # local p50 must stay within this factor of a bare subprocess


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class Bare:
    """The reference: the code written to a file and the same interpreter started directly,
    with pipes, no isolation."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="vime-bench-")
        self.argv = [shutil.which("python3", path=PATH) or "python3", "main.py"]

    async def run(self) -> tuple[bool, float]:
        started = time.perf_counter()
        with open(os.path.join(self.dir, "main.py"), "w") as f:
            f.write(CODE)
        proc = await asyncio.create_subprocess_exec(
            *self.argv, cwd=self.dir, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, _ = await proc.communicate()
        return out == b"1\n" and proc.returncode == 0, time.perf_counter() - started

    async def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class Boxed:
    """One sandbox of a backend, timed per call."""

    def __init__(self, box: Sandbox) -> None:
        self.box = box

    async def run(self) -> tuple[bool, float]:
        started = time.perf_counter()
        result = await self.box.run_code(CODE)
        return result.stdout == "1\n" and result.ok, time.perf_counter() - started

    async def close(self) -> None:
        await self.box.close()


async def measure(workers: list[Any], runs: int) -> tuple[list[float], int, float]:
    """Run ``runs`` executions spread over ``workers`` (one per concurrent slot).

    Returns the latencies, the number of failed executions and the wall time.
    """
    latencies: list[float] = []
    failures = 0
    queue = iter(range(runs))

    async def worker(w: Any) -> None:
        nonlocal failures
        for _ in queue:
            ok, seconds = await w.run()
            latencies.append(seconds)
            failures += not ok

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in workers))
    return latencies, failures, time.perf_counter() - started


def docker_available() -> bool:
    """True when a Docker engine answers and the docker backend's image is present."""
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        client.images.get(os.environ.get("VIME_SANDBOX_IMAGE", "vime-sandbox:bookworm"))
    except Exception:
        return False
    return True


def start_server(token: str) -> tuple[subprocess.Popen, str]:
    """``vime sandbox serve`` (local backend) on a free loopback port; returns it and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "vime.cli.main", "sandbox", "serve", "--port", "0"],
        env={**os.environ, "VIME_SANDBOX_TOKEN": token},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"the sandbox server did not start: {line!r}")
    return proc, line.split()[-1]


async def bench_level(
    makers: dict[str, Callable[[], Awaitable[Any]]], level: int, runs: int, rounds: int
) -> list[dict[str, Any]]:
    """All backends at one concurrency level, interleaved in ``rounds`` so that a change of
    load on a shared machine hits every backend alike."""
    workers = {name: [await make() for _ in range(level)] for name, make in makers.items()}
    samples: dict[str, list[float]] = {name: [] for name in makers}
    failures = dict.fromkeys(makers, 0)
    wall = dict.fromkeys(makers, 0.0)
    try:
        for name in makers:  # warm-up: first calls pay page cache and allocator costs
            await measure(workers[name], level)
        for _ in range(rounds):
            for name in makers:
                latencies, failed, seconds = await measure(workers[name], max(1, runs // rounds))
                samples[name] += latencies
                failures[name] += failed
                wall[name] += seconds
    finally:
        for group in workers.values():
            for w in group:
                await w.close()
    rows = []
    for name, latencies in samples.items():
        row = {
            "backend": name,
            "concurrency": level,
            "runs": len(latencies),
            "rounds": rounds,
            "failures": failures[name],
            "p50_ms": percentile(latencies, 50) * 1000,
            "p99_ms": percentile(latencies, 99) * 1000,
            "mean_ms": statistics.fmean(latencies) * 1000,
            "execs_per_s": len(latencies) / wall[name],
        }
        print(
            f"  {name:7s} c={level:<3d} p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms"
            f"  {row['execs_per_s']:6.1f}/s  failures {row['failures']}",
            file=sys.stderr,
            flush=True,
        )
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The results as a Markdown table, with each p50 relative to bare at the same level."""
    bare = {r["concurrency"]: r["p50_ms"] for r in rows if r["backend"] == "bare"}
    lines = [
        "| backend | concurrency | p50 ms | p99 ms | exec/s | p50 vs bare | failures |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = r["p50_ms"] / bare[r["concurrency"]] if r["concurrency"] in bare else float("nan")
        lines.append(
            f"| {r['backend']} | {r['concurrency']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r['execs_per_s']:.1f} | {ratio:.2f}x | {r['failures']} |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    """Run every selected backend and return the JSON report."""
    load_at_start = os.getloadavg()
    token = secrets.token_urlsafe(24)
    server = None
    makers: dict[str, Callable[[], Awaitable[Any]]] = {}

    async def boxed(backend: str, **options: Any) -> Boxed:
        box = create(backend, **options)
        await box.start()
        return Boxed(box)

    async def bare() -> Bare:
        return Bare()

    wanted = args.backends.split(",")
    skipped = {}
    if "bare" in wanted:
        makers["bare"] = bare
    if "local" in wanted:
        makers["local"] = lambda: boxed("local")
    if "docker" in wanted:
        if docker_available():
            makers["docker"] = lambda: boxed("docker")
        else:
            skipped["docker"] = "no Docker engine or no vime-sandbox image"
    try:
        if "remote" in wanted:
            server, url = start_server(token)
            makers["remote"] = lambda: boxed("remote", url=url, token=token)
        rows = []
        for level in args.concurrency:
            rounds = args.rounds or (args.runs if level == 1 else 10)
            rows += await bench_level(makers, level, args.runs, rounds)
        rows.sort(key=lambda r: (list(makers).index(r["backend"]), r["concurrency"]))
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
    bare_p50 = {r["concurrency"]: r["p50_ms"] for r in rows if r["backend"] == "bare"}
    local_c1 = next((r for r in rows if r["backend"] == "local" and r["concurrency"] == 1), None)
    ratio = local_c1["p50_ms"] / bare_p50[1] if local_c1 and 1 in bare_p50 else None
    return {
        "code": CODE,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_at_start": load_at_start,
            "load": os.getloadavg(),
        },
        # How local switches user and sets rlimits: vime-sandbox-launch, or setpriv + prlimit.
        "local_launcher": find_launcher() or "setpriv+prlimit",
        "runs_per_level": args.runs,
        "rounds": args.rounds,
        "results": rows,
        "skipped": skipped,
        "targets": {
            "local_p50_vs_bare_max": TARGET_LOCAL_VS_BARE,
            "local_p50_vs_bare_at_c1": ratio,
            "local_met": None if ratio is None else ratio <= TARGET_LOCAL_VS_BARE,
        },
    }


def main() -> int:
    """Parse flags, run the benchmark, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="Timed executions per level.")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="Interleaved rounds the runs are split into (default: one call per round at "
        "concurrency 1, so that bare and each backend alternate call by call; 10 above it).",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--backends", default="bare,local,docker,remote")
    parser.add_argument("--out", help="Write the JSON report here.")
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    print(table(report["results"]))
    for name, why in report["skipped"].items():
        print(f"skipped {name}: {why}")
    target = report["targets"]
    if any(r["backend"] == "local" for r in report["results"]):
        start, end = (
            " ".join(f"{x:.2f}" for x in report["machine"][key])
            for key in ("load_at_start", "load")
        )
        print(
            f"local launcher: {report['local_launcher']}; load average at the start: {start}, "
            f"at the end: {end}"
        )
    if target["local_p50_vs_bare_at_c1"] is not None:
        verdict = "met" if target["local_met"] else "MISSED"
        print(
            f"local p50 / bare p50 at concurrency 1: {target['local_p50_vs_bare_at_c1']:.2f} "
            f"(target <= {TARGET_LOCAL_VS_BARE}: {verdict})"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
