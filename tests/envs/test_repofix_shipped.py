"""The RepoFix task set shipped with Vime: its size and splits, and a scripted agent that
applies each task's reference fix through the tools (1.0) or submits at once (0.0)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from vime.envs.repofix.env import RepoFixEnv
from vime.envs.repofix.mutate import KINDS
from vime.envs.repofix.tasks import SHIPPED, load_task_set

TRAIN, EVAL = load_task_set(split="train"), load_task_set(split="eval")


def call(name: str, **arguments) -> str:
    """A Hermes-style tool call, as a model writes it (the env parses it)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


async def reference_fix_reward(env: RepoFixEnv, task: dict) -> float:
    """A scripted agent: run the visible tests, apply the fix with str_replace, submit."""
    await env.areset(options={"task": task})
    await env.astep(call("run_tests"))
    for edit in task["fix"]:
        observation, *_ = await env.astep(
            call("str_replace", path=edit["path"], old_str=edit["old"], new_str=edit["new"])
        )
        assert observation[0]["content"].startswith("Replaced 1 occurrence"), observation
    _, reward, terminated, _, info = await env.astep(call("submit"))
    assert terminated and info["diff"].startswith(f"--- a/{task['fix'][0]['path']}")
    return reward


async def submit_at_once_reward(env: RepoFixEnv, task: dict) -> float:
    await env.areset(options={"task": task})
    _, reward, terminated, _, info = await env.astep(call("submit"))
    assert terminated and info["diff"] == "" and info["pass_fraction"] < 1.0
    return reward


def sample(count: int, seed: int) -> list[dict]:
    return random.Random(seed).sample(TRAIN + EVAL, count)


def test_the_shipped_set_has_300_tasks_from_8_packages_with_a_held_out_split():
    tasks = TRAIN + EVAL
    assert len(tasks) >= 300 and len(EVAL) >= 40
    assert len({t["id"] for t in tasks}) == len(tasks)
    packages = Counter(t["metadata"]["package"] for t in tasks)
    assert len(packages) >= 6 and min(packages.values()) >= 20
    assert set(Counter(t["metadata"]["mutation"] for t in tasks)) == set(KINDS)
    manifest = json.loads((SHIPPED / "manifest.json").read_text())
    assert manifest["splits"] == {"train": len(TRAIN), "eval": len(EVAL)}
    assert {p["package"]: p["tasks"] for p in manifest["packages"]} == dict(packages)


async def test_reference_fix_scores_one_and_the_bug_zero_on_a_few_tasks_locally():
    env = RepoFixEnv(tasks=TRAIN, sandbox="local")
    for task in sample(3, seed=1):
        assert await reference_fix_reward(env, task) == 1.0, task["id"]
        assert await submit_at_once_reward(env, task) == 0.0, task["id"]


@pytest.mark.slow
@pytest.mark.parametrize(
    # CI runs docker (the stricter backend); the fast suite runs 3 tasks locally.
    "backend",
    [
        pytest.param("local", marks=pytest.mark.extended),
        pytest.param("docker", marks=pytest.mark.docker),
    ],
)
async def test_reference_fix_scores_one_and_the_bug_zero_on_30_sampled_tasks(backend):
    env = RepoFixEnv(tasks=TRAIN, sandbox=backend)
    tasks = sample(30, seed=19)
    fixed = [await reference_fix_reward(env, t) for t in tasks]
    as_shipped = [await submit_at_once_reward(env, t) for t in tasks]
    print(
        f"{backend}: reference fix mean {sum(fixed) / 30}, submit at once mean {sum(as_shipped) / 30}"
    )
    assert fixed == [1.0] * 30, [t["id"] for t, r in zip(tasks, fixed, strict=True) if r != 1.0]
    assert as_shipped == [0.0] * 30, [
        t["id"] for t, r in zip(tasks, as_shipped, strict=True) if r != 0.0
    ]
