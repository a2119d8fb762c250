"""``vime eval`` as a user runs it (a subprocess against the stub): API key from the
environment, kill -9 and Ctrl-C then resume without a duplicate or missing sample, bad flags."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import pytest

import vime.view
from vime.cli.main import main

PYTHON = sys.executable


async def run_cli(args: list[str], env: dict[str, str] | None = None):
    """Start ``vime eval ARGS`` as a subprocess; return the process."""
    return await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "vime",
        "eval",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


def keys(output) -> list[tuple[str, int]]:
    lines = (output / "results.jsonl").read_text().splitlines()
    return [(json.loads(x)["task_id"], json.loads(x)["sample_index"]) for x in lines]


async def test_api_key_comes_from_the_environment_and_is_never_written(
    stub_factory, task_file, tmp_path
):
    rows = [("1+1", "2"), ("2+5", "7")]
    stub = await stub_factory(dict(rows))
    out = tmp_path / "out"
    args = ["--env", "vime/Math-v0", "--tasks", str(task_file(rows)), "--n", "2", "--k", "1,2"]
    proc = await run_cli(
        [*args, "--base-url", stub.url, "--model", "stub", "--output", str(out)],
        env={"VIME_EVAL_API_KEY": "sk-secret-123", "OPENAI_API_KEY": "sk-other"},
    )
    _, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    assert stub.api_keys == {"Bearer sk-secret-123"}
    assert "pass@1 1.0000" in stderr.decode()
    for path in out.iterdir():
        assert "sk-secret" not in path.read_text(), path
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pass@2"] == 1.0 and summary["num_failed"] == 0
    # The printed viewer command opens this very output dir.
    assert f"vime: browse the samples: vime view {out}" in stderr.decode()
    assert vime.view.build(out)[1].index["task"] == [task for task, _ in keys(out)]


@pytest.mark.slow  # two CLI runs with math grading: 40 s on a loaded 2-core machine
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
async def test_killed_run_resumes_without_duplicate_or_missing_samples(
    sig, stub_factory, task_file, tmp_path
):
    rows = [(f"{i}+1", str(i + 1)) for i in range(12)]
    stub = await stub_factory(dict(rows), delay=0.15)
    out = tmp_path / "out"
    args = [
        *("--env", "vime/Math-v0", "--tasks", str(task_file(rows)), "--n", "4", "--k", "1,4"),
        *("--concurrency", "4", "--base-url", stub.url, "--model", "stub", "--output", str(out)),
    ]
    proc = await run_cli(args)
    results = out / "results.jsonl"
    for _ in range(600):  # until some samples are recorded (at most 60 s)
        if results.exists() and len(results.read_text().splitlines()) >= 8:
            break
        await asyncio.sleep(0.1)
    proc.send_signal(sig)
    await proc.communicate()
    assert proc.returncode == (-9 if sig == signal.SIGKILL else 130)
    before = keys(out)
    assert 8 <= len(before) < 48, "the run must be stopped mid-way for this test to mean much"
    proc = await run_cli(args)
    _, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    after = keys(out)
    assert len(after) == len(set(after)) == 48
    assert set(after) == {(f"t{i}", s) for i in range(12) for s in range(4)}
    assert after[: len(before)] == before  # the resumed run appended, never rewrote
    for task_id, sample in before:  # recorded samples were not asked for again
        assert stub.requests[f"{task_id}/{sample}"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--base-url", "http://127.0.0.1:9/v1"], "needs --model NAME"),
        (["--model", "m"], "either --base-url URL with --model NAME, or --serve"),
        (["--base-url", "http://x/v1", "--model", "m", "--serve", "/m"], "either --base-url"),
        (["--serve", "/m", "--model", "m"], "with --serve leave it out"),
        (
            ["--base-url", "http://x/v1", "--model", "m", "--vllm-max-model-len", "512"],
            "--vllm-max-model-len only applies with --serve",
        ),
        (["--base-url", "http://x/v1", "--model", "m", "--n", "2", "--k", "4"], "1..--n"),
    ],
)
def test_bad_command_lines_are_refused(args, message, tmp_path, capsys):
    code = main(["eval", "--env", "vime/Math-v0", "--output", str(tmp_path / "o"), *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_api_key_is_not_a_flag(tmp_path, capsys):
    code = main(["eval", "--env", "vime/Math-v0", "--output", "o", "--api-key", "sk-1"])
    assert code == 2
    assert "unrecognized argument '--api-key'" in capsys.readouterr().err


def test_a_refused_output_dir_starts_no_engine(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "config.json").write_text('{"env": "vime/Math-v0", "n": 99}')
    code = main(["eval", "--env", "vime/Math-v0", "--output", str(out), "--serve", "/no/model"])
    err = capsys.readouterr().err
    assert code == 2
    assert "holds results of a different eval config" in err and "starting engines" not in err
