"""The peer side of ``bench/rollout_overhead.py`` for ``verifiers`` 0.4 (``verifiers.v1``):
the same add-tool task on the same stub server, run by its own ``vf-eval`` (in-process env,
the ``null`` chat harness in a subprocess runtime, the tool as an MCP toolset). Runs in a venv
of its own (never imports Vime) and prints one JSON line with its turns per second.

Time is measured from the first episode's start to the last episode's end as the traces
record them, so the CLI's own start-up is left out; per-episode setup (the harness program
and tool server) is part of every verifiers 0.4 rollout and stays in.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

TASKSET = Path(__file__).with_name("verifiers_v1")
# Every concurrent verifiers 0.4 rollout is two Python processes of its own: the null harness's
# chat program and the task's MCP tool server. 256 tool servers alone took about 18 GB here
# (70 MB each, before any chat program started; the 24 GB machine reached load 250 and the
# run was stopped), so a rollout needs at least twice that.
MB_PER_ROLLOUT = 140
HEADROOM_MB = 2048


def available_mb() -> int:
    """MemAvailable of this machine, in MB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def check_resources(vf_eval: Path, concurrency: int) -> None:
    """Refuse, with the reason, a run this machine cannot hold or that would fetch ``uv``."""
    if not vf_eval.with_name("uv").exists():
        raise SystemExit(
            f"no uv in {vf_eval.parent}: verifiers 0.4 prepares its harness program with uv and "
            "otherwise downloads it from the internet; pip install uv into that venv"
        )
    need, have = concurrency * MB_PER_ROLLOUT + HEADROOM_MB, available_mb()
    if need > have:
        raise SystemExit(
            f"concurrency {concurrency} needs about {need} MB (two processes per rollout, "
            f"{MB_PER_ROLLOUT} MB, plus {HEADROOM_MB} MB headroom); {have} MB available"
        )


def drive(url: str, concurrency: int, episodes: int, turns: int) -> dict:
    vf_eval = Path(sys.executable).with_name("vf-eval")
    check_resources(vf_eval, concurrency)
    with tempfile.TemporaryDirectory() as cwd:
        argv = [str(vf_eval), "vime-adder", "-m", "stub", "--client.base-url", url]
        argv += ["--client.api-key-var", "VIME_BENCH_KEY", "-n", str(episodes), "-r", "1"]
        argv += ["-c", str(concurrency), "--env.agent.harness.id", "null"]
        argv += ["--env.agent.runtime.type", "subprocess", "--env.agent.max-turns", str(turns + 1)]
        argv += ["--env.taskset.num-tasks", str(episodes), "--no-push", "--no-rich"]
        env = {**os.environ, "PYTHONPATH": str(TASKSET), "VIME_BENCH_KEY": "stub"}
        env["PATH"] = f"{vf_eval.parent}{os.pathsep}{env.get('PATH', '')}"
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"vf-eval failed: {proc.stderr[-2000:]}")
        traces = [
            t
            for path in Path(cwd).glob("outputs/*/traces.jsonl")
            for line in path.read_text().splitlines()
            for t in json.loads(line)["traces"]
        ]
    starts = [t["timing"]["start"] for t in traces]
    ends = [t["timing"]["scoring"]["end"] or t["timing"]["agent"]["end"] for t in traces]
    elapsed = max(ends) - min(starts)
    done = sum(len(t["calls"]) for t in traces)
    correct = sum(t["rewards"].get("reward", {}).get("score") == 1.0 for t in traces)
    errors = [str(t["errors"])[:200] for t in traces if t["errors"]]
    return {
        "framework": "verifiers",
        "version": version("verifiers"),
        "concurrency": concurrency,
        "episodes": len(traces),
        "correct_episodes": correct,
        "turns": done,
        "seconds": round(elapsed, 3),
        "turns_per_s": round(done / elapsed, 1),
        "failed_episodes": len(errors),
        "first_error": errors[0] if errors else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--episodes", type=int, required=True)
    parser.add_argument("--turns", type=int, required=True)
    args = parser.parse_args()
    print(json.dumps(drive(args.url, args.concurrency, args.episodes, args.turns)))


if __name__ == "__main__":
    main()
