"""Rollout overhead: env turns per second driven by Vime's rollout manager against a
zero-latency vLLM-like stub server (separate process), for a multi-turn tool env without a
sandbox, at several concurrencies; beside it, the same stub and task driven by the PyPI
``verifiers`` package when a venv with it is given. Prints a table; ``--out FILE`` writes JSON.

    .venv/bin/python bench/rollout_overhead.py --concurrency 32 256 \\
        --verifiers-python /tmp/verifiers-venv/bin/python /tmp/verifiers01-venv/bin/python \\
        --out rollout_overhead.json

Peer venvs: ``pip install verifiers==0.4.0 uv`` (0.4 prepares its harness program with uv and
would download uv otherwise) and ``pip install verifiers==0.1.14``. verifiers 0.4 runs two
processes per concurrent rollout; its driver refuses a concurrency this machine's memory
cannot hold (about 140 MB a rollout) and the row says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import vime
from vime.agents import AgentConfig, ChatTemplateRenderer
from vime.inference.client import VimeClient
from vime.inference.sampling import SamplingConfig
from vime.rollout import RolloutConfig, RolloutManager

# The stub engine is test support (tests/support), not product.
STUB = Path(__file__).resolve().parents[1] / "tests" / "support" / "stub_engine.py"
sys.path.insert(0, str(STUB.parent))
from stub_engine import ByteTokenizer  # noqa: E402

TURNS = 5  # assistant turns per episode: 4 tool calls, then the answer
GOAL_AT_256 = 1000.0


class AdderEnv(vime.ToolEnv):
    """Add numbers with a tool until the model answers (the benchmark's tool env)."""

    def __init__(self) -> None:
        super().__init__(tool_parser="hermes")
        self.calls = 0

    @vime.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: first addend
            b: second addend
        """
        self.calls += 1
        return str(a + b)

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        self.calls = 0
        return [{"role": "user", "content": "Count with the add tool, then answer."}], {}

    def answer(self, message):
        return [], float(str(self.calls) in (message.get("content") or "")), True, False, {}


def start_stub() -> tuple[subprocess.Popen, str]:
    """The stub server in its own process (so the engine side never shares our event loop)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(STUB),
            "--turns",
            str(TURNS),
            "--parse-tool-calls",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"stub server did not start: {line!r}")
    return proc, line.split()[1]


async def vime_turns_per_s(url: str, concurrency: int, episodes: int, mode: str) -> dict[str, Any]:
    """Run ``episodes`` episodes at ``concurrency`` through the rollout manager."""
    client = VimeClient(url, model="stub", max_connections=concurrency, max_retries=0)
    n = 8
    manager = RolloutManager(
        RolloutConfig(
            env_id="bench/Adder-v0", n=n, max_concurrency=concurrency, episode_timeout=600
        ),
        lambda: client,
        AgentConfig(mode=mode, max_turns=TURNS + 1),
        renderer=ChatTemplateRenderer(ByteTokenizer()),
        env_factory=lambda env_id: AdderEnv(),
    )
    tasks = [{"id": str(i)} for i in range(episodes // n)]
    started = time.perf_counter()
    batch = await manager.generate(tasks, SamplingConfig(max_tokens=128))
    elapsed = time.perf_counter() - started
    await client.close()
    trajectories = batch.trajectories
    ok = sum(t.status is vime.Status.COMPLETED and t.reward == 1.0 for t in trajectories)
    turns = sum(t.metrics["num_turns"] for t in trajectories)
    return {
        "framework": f"vime ({mode})",
        "concurrency": concurrency,
        "episodes": len(trajectories),
        "correct_episodes": ok,
        "turns": int(turns),
        "seconds": round(elapsed, 3),
        "turns_per_s": round(turns / elapsed, 1),
        "drift": int(batch.metrics["drift_count"]),
    }


def verifiers_version(python: str) -> str:
    """The ``verifiers`` version installed in the venv of ``python``."""
    out = subprocess.run(
        [python, "-c", "import verifiers; print(verifiers.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout.strip() or "unknown"


def verifiers_turns_per_s(
    python: str, version: str, url: str, concurrency: int, episodes: int
) -> dict[str, Any]:
    """The same task driven by ``verifiers`` in its own venv: ``_verifiers_driver.py`` for the
    0.1.x API, ``_verifiers_v1_driver.py`` for the 0.4 (``verifiers.v1``) API."""
    v1 = tuple(int(x) for x in version.split(".")[:2] if x.isdigit()) >= (0, 4)
    driver = Path(__file__).with_name("_verifiers_v1_driver.py" if v1 else "_verifiers_driver.py")
    argv = [python, str(driver), "--url", url, "--concurrency", str(concurrency)]
    argv += ["--episodes", str(episodes), "--turns", str(TURNS)]
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=1800,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    if out.returncode != 0:
        return {
            "framework": f"verifiers {version}",
            "concurrency": concurrency,
            "error": out.stderr.strip().splitlines()[-1:],
        }
    row = json.loads(out.stdout.strip().splitlines()[-1])
    return {**row, "framework": f"verifiers {version}"}


def print_table(rows: list[dict[str, Any]]) -> None:
    """The rows side by side; each vime row with its speed-up over every verifiers version."""
    peers = sorted({r["framework"] for r in rows if r["framework"].startswith("verifiers")})
    head = f"{'framework':<20}{'concurrency':>12}{'episodes':>10}{'turns/s':>10}"
    print("\n" + head + "".join(f"{'vs ' + p:>22}" for p in peers))
    for row in rows:
        if "error" in row:
            print(f"{row['framework']:<20}{row['concurrency']:>12}  error: {row['error']}")
            continue
        cells = []
        for peer in peers:
            ref = next(
                (
                    r
                    for r in rows
                    if r["framework"] == peer
                    and r["concurrency"] == row["concurrency"]
                    and r.get("turns_per_s")
                ),
                None,
            )
            mine = row["framework"].startswith("vime") and ref
            cells.append(f"{row['turns_per_s'] / ref['turns_per_s']:.1f}x" if mine else "-")
        print(
            f"{row['framework']:<20}{row['concurrency']:>12}{row['episodes']:>10}"
            f"{row['turns_per_s']:>10.0f}" + "".join(f"{c:>22}" for c in cells)
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument(
        "--episodes",
        type=int,
        default=0,
        help="episodes per point (default: max(64, 2 x concurrency))",
    )
    parser.add_argument("--mode", choices=["tokens", "chat"], nargs="+", default=["tokens", "chat"])
    parser.add_argument(
        "--verifiers-python",
        nargs="+",
        default=[],
        help="python of each venv with a verifiers version installed (one row per version)",
    )
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()

    peers = [(python, verifiers_version(python)) for python in args.verifiers_python]
    stub, url = start_stub()
    rows: list[dict[str, Any]] = []
    try:
        for concurrency in args.concurrency:
            episodes = args.episodes or max(64, 2 * concurrency)
            for mode in args.mode:
                rows.append(asyncio.run(vime_turns_per_s(url, concurrency, episodes, mode)))
                print(json.dumps(rows[-1]), flush=True)
            for python, version in peers:
                rows.append(verifiers_turns_per_s(python, version, url, concurrency, episodes))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        stub.kill()
        stub.wait()

    print_table(rows)
    at_256 = [
        r["turns_per_s"]
        for r in rows
        if r.get("concurrency") == 256 and r["framework"].startswith("vime")
    ]
    if at_256:
        verdict = "meets" if max(at_256) >= GOAL_AT_256 else "misses"
        print(
            f"\nbest vime turns/s at 256: {max(at_256):.0f} ({verdict} the goal of {GOAL_AT_256:.0f})"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "cpus": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
