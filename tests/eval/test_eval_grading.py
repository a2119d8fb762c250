"""``vime eval`` on Math-v0 with a hostile sample: its grading is killed at the limit and
scores 0, the other samples are graded as usual, and the run is not held up."""

from __future__ import annotations

import json
import time

from vime.eval.config import EvalConfig
from vime.eval.runner import evaluate


async def test_a_huge_answer_is_killed_at_the_grader_limit_and_the_rest_are_graded(
    stub_factory, tmp_path
):
    rows = [
        {"id": "huge", "question": "What is 9^9^9?", "answer": "1", "answer_type": "expression"},
        *(
            {"id": f"ok{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)}
            for i in range(7)
        ),
    ]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    replies = {r["question"]: f"\\boxed{{{r['answer']}}}" for r in rows}
    replies["What is 9^9^9?"] = "\\boxed{9^{9^{9}}}"
    stub = await stub_factory(replies, script=lambda question: ["verbatim"])
    config = EvalConfig(
        env="vime/Math-v0",
        env_kwargs=json.dumps({"grader_timeout": 2.0}),
        tasks=str(tasks),
        output=str(tmp_path / "out"),
        n=1,
        k="1",
        concurrency=8,
    )
    started = time.monotonic()
    summary = await evaluate(config, base_url=stub.url, model="stub")
    assert time.monotonic() - started < 30
    results = {
        r["task_id"]: r
        for r in map(json.loads, (tmp_path / "out" / "results.jsonl").read_text().splitlines())
    }
    assert results["huge"]["reward"] == 0.0 and results["huge"]["error"] is None
    assert all(results[f"ok{i}"]["reward"] == 1.0 for i in range(7))
    assert summary["pass@1"] == 7 / 8
