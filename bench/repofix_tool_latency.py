"""RepoFix tool-call overhead: p50 of one ``bash`` tool call through the env (parse the
action, dispatch the tool, ``docker exec`` through the sandbox API, format the observation)
beside a bare ``docker exec`` of the same command into the same container, interleaved call
by call in one run. The target: the env's p50 at most 1.5x the bare one.

    flock /tmp/vime-heavy.lock .venv/bin/python bench/repofix_tool_latency.py --runs 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

from vime.envs.repofix.env import RepoFixEnv

TARGET = 1.5
COMMANDS = ("python3 -c 'print(1)'", "cat stats.py")
TASK = {
    "id": "bench",
    "repo": {"stats.py": "def mean(v):\n    return sum(v) / len(v)\n"},
    "instruction": "nothing to fix",
    "hidden_tests": ["test_stats.py"],
}


def tool_call(command: str) -> dict:
    arguments = json.dumps({"command": command})
    call = {"id": "c", "type": "function", "function": {"name": "bash", "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


async def bench(runs: int) -> dict:
    env = RepoFixEnv(tasks=[TASK], sandbox="docker", max_turns=10 * runs + 10)  # never graded
    await env.areset(options={"task": TASK})
    box = env.sandbox.box
    assert box is not None
    bare = ["docker", "exec", "-u", box.user, "-w", "/work", box.container_id, "sh", "-c"]
    results = {}
    try:
        for command in COMMANDS:
            via_env, via_docker = [], []
            expected = (await env.astep(tool_call(command)))[0][0]["content"]
            for _ in range(runs):  # interleaved, so load on the machine hits both alike
                start = time.perf_counter()
                observation = (await env.astep(tool_call(command)))[0][0]["content"]
                via_env.append(time.perf_counter() - start)
                assert observation == expected, observation
                start = time.perf_counter()
                done = await asyncio.to_thread(
                    subprocess.run, [*bare, command], capture_output=True, check=True
                )
                via_docker.append(time.perf_counter() - start)
                assert done.stdout.decode().rstrip("\n") == expected
            env_p50, docker_p50 = statistics.median(via_env), statistics.median(via_docker)
            results[command] = {
                "env_p50_ms": round(env_p50 * 1000, 1),
                "docker_exec_p50_ms": round(docker_p50 * 1000, 1),
                "ratio": round(env_p50 / docker_p50, 3),
                "runs": runs,
            }
    finally:
        await env.sandbox.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    results = asyncio.run(bench(args.runs))
    print(f"{'command':<24} {'env p50 ms':>10} {'docker exec p50 ms':>19} {'ratio':>6}")
    for command, r in results.items():
        print(f"{command:<24} {r['env_p50_ms']:>10} {r['docker_exec_p50_ms']:>19} {r['ratio']:>6}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"target_ratio": TARGET, "results": results}, f, indent=1)
    worst = max(r["ratio"] for r in results.values())
    print(f"worst ratio {worst} (target <= {TARGET})")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
