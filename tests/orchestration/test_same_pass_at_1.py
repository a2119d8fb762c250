"""`vime eval`, `vime rollout` and `vime train`'s held-out eval score the same episodes the
same way: against one scripted stub engine, all three report the same pass@1 and mean reward
(the stub answers questions 0, 3 and 6 of 0..7 right: 3/8)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from stub_engine import StubServer

from vime.cli.main import main, parse_args
from vime.cli.train_cmd import build_setup
from vime.orchestration.loop import RLLoop

TASKS = [{"id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]
EXPECTED = 3 / 8


def policy(prompt: str) -> str:
    i = int(re.findall(r"What is (\d+) \+ 1\?", prompt)[-1])
    return f"\\boxed{{{i + 1 if i % 3 == 0 else 1000}}}"


@pytest.fixture
async def stub(tiny_model: Path):
    from transformers import AutoTokenizer

    async with StubServer(AutoTokenizer.from_pretrained(tiny_model), policy) as server:
        yield server


@pytest.fixture
def task_path(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return path


async def _vime(argv: list[str]) -> int:
    import asyncio

    # The commands run their own event loop: give them a thread, as from a shell.
    return await asyncio.to_thread(main, argv)


async def test_eval_rollout_and_train_report_the_same_pass_at_1(
    stub, tiny_model, task_path, tmp_path, capsys
):
    common = ["--env", "vime/Math-v0", "--tasks", str(task_path), "--n", "1"]
    out = tmp_path / "eval"
    argv = ["eval", *common, "--base-url", stub.url, "--model", "stub", "--k", "1"]
    assert await _vime([*argv, "--output", str(out)]) == 0
    evaluated = json.loads((out / "summary.json").read_text())

    capsys.readouterr()
    argv = ["rollout", *common, "--model", "stub", "--base-url", stub.url, "--agent-mode", "chat"]
    assert await _vime([*argv, "--output", str(tmp_path / "r.jsonl")]) == 0
    line = capsys.readouterr().err
    rolled = re.search(r"pass@1 ([\d.]+), mean reward ([\d.]+)", line)
    assert rolled, line

    argv = ["train", "--model", str(tiny_model), *common[:2], "--output-dir", str(tmp_path)]
    setup = build_setup(parse_args(argv))
    cluster = SimpleNamespace(base_url=stub.url, model_name="stub")
    loop = RLLoop(setup, cluster, None, tasks=TASKS, eval_tasks=TASKS)
    trained = await loop.evaluate()
    await loop.close()

    assert evaluated["pass@1"] == pytest.approx(EXPECTED)
    assert float(rolled.group(1)) == pytest.approx(EXPECTED)
    assert trained["eval/pass@1"] == pytest.approx(EXPECTED)
    assert evaluated["mean_reward"] == float(rolled.group(2)) == trained["eval/mean_reward"]
