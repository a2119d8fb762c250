"""``vime rollout`` end to end against the stub engine (as a process), through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import stub_engine

from vime.cli.main import main

MATH = ["rollout", "--env", "vime/Math-v0", "--model", "stub"]


def question(line: dict) -> str:
    return next(m["content"] for m in line["messages"] if m["role"] == "user")


@pytest.fixture
def stub_url():
    proc = subprocess.Popen(
        [sys.executable, stub_engine.__file__, "--turns", "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("READY "), line
    yield line.split()[1]
    proc.kill()
    proc.wait()


def test_rollout_command_writes_one_line_per_episode(stub_url, tmp_path, capsys):
    out = tmp_path / "rollout.jsonl"
    code = main(
        [
            *MATH,
            "--base-url",
            stub_url,
            "--n",
            "3",
            "--num-tasks",
            "2",
            "--agent-mode",
            "chat",
            "--output",
            str(out),
        ]
    )

    assert code == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 6
    assert sorted({line["task_id"] for line in lines}) == ["seed-0", "seed-1"]
    for line in lines:
        n = len(line["token_ids"])
        assert len(line["loss_mask"]) == n == len(line["logprobs"])
        assert line["status"] == "completed"
        assert line["messages"][-1]["role"] == "assistant"
        assert line["group_kept"] is True
    # the episodes of a group share their task (one env seed per group)
    by_task = {}
    for line in lines:
        by_task.setdefault(line["task_id"], set()).add(question(line))
    assert all(len(questions) == 1 for questions in by_task.values())
    assert "6 episodes (6 completed" in capsys.readouterr().err


def test_rollout_command_rejects_a_bad_task_count(stub_url, tmp_path, capsys):
    code = main(
        [*MATH, "--base-url", stub_url, "--num-tasks", "0", "--output", str(tmp_path / "x")]
    )
    assert code == 2
    assert "--num-tasks must be >= 1, got 0" in capsys.readouterr().err


def test_rollout_command_explains_a_wrong_base_url(tmp_path, capsys):
    code = main([*MATH, "--base-url", "http://127.0.0.1:9/v1", "--output", str(tmp_path / "x")])
    assert code == 2
    assert "cannot list the models at --base-url http://127.0.0.1:9/v1" in capsys.readouterr().err


def test_rollout_command_without_model_needs_base_url(tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    code = main(["rollout", "--env", "vime/Math-v0", "--output", str(out)])
    assert code == 2
    assert "vime rollout needs --model" in capsys.readouterr().err
    assert not out.exists()


def test_rollout_command_with_base_url_and_no_model_explains_token_mode(stub_url, tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    code = main(["rollout", "--env", "vime/Math-v0", "--base-url", stub_url, "--output", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"--base-url {stub_url} without --model" in err
    assert "give --model" in err and "--agent-mode chat" in err
    assert not out.exists()


def test_rollout_command_with_base_url_plays_chat_mode_without_model(stub_url, tmp_path, capsys):
    out = tmp_path / "rollout.jsonl"
    argv = ["rollout", "--env", "vime/Math-v0", "--base-url", stub_url, "--agent-mode", "chat"]
    code = main([*argv, "--num-tasks", "1", "--n", "2", "--output", str(out)])
    assert code == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["status"] for line in lines] == ["completed", "completed"]
    assert "2 episodes (2 completed" in capsys.readouterr().err
