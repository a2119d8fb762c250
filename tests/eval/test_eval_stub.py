"""``vime eval`` against a local faulty OpenAI-compatible stub: every sample ends recorded with
its reason, resumes skip finished samples, changed configs are refused."""

from __future__ import annotations

import json
import time

import pytest

from vime.errors import ConfigError
from vime.eval.config import EvalConfig
from vime.eval.runner import evaluate
from vime.inference.openai_client import RateLimiter
from vime.inference.sampling import SamplingConfig

SCRIPTED = [
    ("1+1 [right]", "2"),
    ("2+2 [429,right]", "4"),
    ("3+3 [500,500,right]", "6"),
    ("4+4 [429]", "8"),
    ("5+5 [500]", "10"),
    ("6+6 [timeout]", "12"),
    ("7+7 [malformed]", "14"),
    ("8+8 [no_choices]", "16"),
    ("9+9 [wrong]", "18"),
]


def config(tasks, output, **overrides) -> EvalConfig:
    """A fast eval config: tiny backoff, short request timeout."""
    values = dict(
        env="vime/Math-v0",
        tasks=str(tasks),
        output=str(output),
        n=2,
        k="1,2",
        max_retries=2,
        retry_backoff=0.01,
        request_timeout=0.5,
        concurrency=8,
    )
    values.update(overrides)
    return EvalConfig(**values)


def read_rows(output) -> list[dict]:
    return [json.loads(line) for line in (output / "results.jsonl").read_text().splitlines()]


async def test_every_sample_is_recorded_with_its_failure_reason(stub_factory, task_file, tmp_path):
    stub = await stub_factory(dict(SCRIPTED), hang=3.0)
    out = tmp_path / "out"
    summary = await evaluate(config(task_file(SCRIPTED), out), base_url=stub.url, model="stub")
    rows = {(r["task_id"], r["sample_index"]): r for r in read_rows(out)}
    assert len(rows) == len(read_rows(out)) == 18
    expected = {
        "t0": (None, True, 1),
        "t1": (None, True, 2),
        "t2": (None, True, 3),
        "t3": ("rate_limited", False, 3),
        "t4": ("server_error", False, 3),
        "t5": ("timeout", False, 3),
        "t6": ("malformed_response", False, 3),
        "t7": ("malformed_response", False, 3),
        "t8": (None, False, 1),
    }
    for (task_id, _), row in rows.items():
        reason, correct, attempts = expected[task_id]
        assert (row["error"] or "").split(":")[0] == (reason or ""), row
        assert row["correct"] is correct, row
        assert row["attempts"] == attempts, row
        assert row["reward"] == (1.0 if correct else 0.0)
    assert rows[("t8", 0)]["answer"] == "-1"
    assert summary["num_failed"] == 10
    assert summary["failures"] == {
        "rate_limited": 2,
        "server_error": 2,
        "timeout": 2,
        "malformed_response": 4,
    }
    assert summary["pass@1"] == pytest.approx(3 / 9)
    assert summary["mean_reward"] == pytest.approx(3 / 9)
    saved = json.loads((out / "summary.json").read_text())
    assert saved["pass@2"] == pytest.approx(3 / 9) and saved["num_failed"] == 10
    assert "malformed_response | 4" in (out / "report.md").read_text()


async def test_rerun_skips_finished_samples(stub_factory, task_file, tmp_path):
    rows = [("1+1", "2"), ("2+3", "5")]
    stub = await stub_factory(dict(rows))
    out = tmp_path / "out"
    cfg = config(task_file(rows), out, n=3, k="1")
    await evaluate(cfg, base_url=stub.url, model="stub")
    assert sum(stub.requests.values()) == 6
    summary = await evaluate(cfg, base_url=stub.url, model="stub")
    assert sum(stub.requests.values()) == 6  # nothing was asked again
    assert len(read_rows(out)) == 6
    assert summary["pass@1"] == 1.0 and summary["complete"]


async def test_changed_config_is_refused_unless_overwrite(stub_factory, task_file, tmp_path):
    rows = [("1+1", "2")]
    stub = await stub_factory(dict(rows))
    out = tmp_path / "out"
    tasks = task_file(rows)
    await evaluate(config(tasks, out), base_url=stub.url, model="stub")
    with pytest.raises(ConfigError, match=r"changed: temperature\).*--overwrite"):
        await evaluate(
            config(tasks, out, sampling=SamplingConfig(temperature=0.5)),
            base_url=stub.url,
            model="stub",
        )
    with pytest.raises(ConfigError, match=r"changed: model"):
        await evaluate(config(tasks, out), base_url=stub.url, model="other")
    await evaluate(
        config(tasks, out, sampling=SamplingConfig(temperature=0.5), overwrite=True),
        base_url=stub.url,
        model="stub",
    )
    assert len(read_rows(out)) == 2
    assert json.loads((out / "config.json").read_text())["temperature"] == 0.5


async def test_concurrency_and_timeouts_may_change_on_resume(stub_factory, task_file, tmp_path):
    rows = [("1+1", "2")]
    stub = await stub_factory(dict(rows))
    out = tmp_path / "out"
    tasks = task_file(rows)
    await evaluate(config(tasks, out), base_url=stub.url, model="stub")
    summary = await evaluate(
        config(tasks, out, concurrency=1, request_timeout=9.0, k="2"),
        base_url=stub.url,
        model="stub",
    )
    assert summary["pass@2"] == 1.0 and "pass@1" not in summary


async def test_retry_failed_reruns_only_failed_samples(stub_factory, task_file, tmp_path):
    rows = [("1+1", "2"), ("2+2", "4")]
    broken = {"2+2"}
    stub = await stub_factory(dict(rows), script=lambda q: ["500"] if q in broken else ["right"])
    out = tmp_path / "out"
    tasks = task_file(rows)
    first = await evaluate(config(tasks, out, max_retries=0), base_url=stub.url, model="stub")
    assert first["num_failed"] == 2 and first["pass@1"] == 0.5
    broken.clear()
    again = await evaluate(config(tasks, out, retry_failed=True), base_url=stub.url, model="stub")
    assert again["num_failed"] == 0 and again["pass@1"] == 1.0
    assert stub.requests["t0/0"] == 1 and stub.requests["t1/0"] == 2


async def test_a_partial_last_line_is_dropped_on_resume(stub_factory, task_file, tmp_path):
    rows = [("1+1", "2")]
    stub = await stub_factory(dict(rows))
    out = tmp_path / "out"
    cfg = config(task_file(rows), out, n=2)
    await evaluate(cfg, base_url=stub.url, model="stub")
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text(lines[0] + "\n" + lines[1][:25])  # kill -9 mid-write
    await evaluate(cfg, base_url=stub.url, model="stub")
    keys = [(r["task_id"], r["sample_index"]) for r in read_rows(out)]
    assert sorted(keys) == [("t0", 0), ("t0", 1)]


async def test_requests_per_second_spaces_requests(stub_factory, task_file, tmp_path):
    rows = [("1+1", "2")]
    stub = await stub_factory(dict(rows))
    started = time.monotonic()
    await evaluate(
        config(task_file(rows), tmp_path / "out", n=6, k="1", requests_per_second=10.0),
        base_url=stub.url,
        model="stub",
    )
    assert time.monotonic() - started >= 0.5  # 6 requests, 0.1 s apart


async def test_rate_limiter_has_no_burst():
    limiter = RateLimiter(20.0)
    started = time.monotonic()
    for _ in range(5):
        await limiter.wait()
    assert 0.2 <= time.monotonic() - started < 1.0
    unlimited = RateLimiter(None)
    started = time.monotonic()
    for _ in range(100):
        await unlimited.wait()
    assert time.monotonic() - started < 0.1


async def test_env_own_generated_tasks_are_used_without_a_file(stub_factory, tmp_path):
    stub = await stub_factory({})
    out = tmp_path / "out"
    cfg = EvalConfig(env="vime/Math-v0", output=str(out), n=1, num_tasks=5, task_seed=3)
    summary = await evaluate(cfg, base_url=stub.url, model="stub")
    ids = json.loads((out / "config.json").read_text())["task_ids"]
    assert len(ids) == 5 and len(set(ids)) == 5
    assert summary["num_tasks"] == 5 and summary["num_failed"] == 0


async def test_env_without_tasks_needs_a_task_file(tmp_path):
    cfg = EvalConfig(env="vime/GuessNumber-v0", output=str(tmp_path / "o"), n=1)
    with pytest.raises(ConfigError, match="give --tasks FILE"):
        await evaluate(cfg, base_url="http://127.0.0.1:9/v1", model="m")


@pytest.mark.parametrize(
    ("k", "message"),
    [("0", "1..--n"), ("9", "1..--n"), ("1,x", "comma-separated integers"), (",", "at least one")],
)
def test_bad_k_is_refused(k, message):
    with pytest.raises(ConfigError, match=message):
        EvalConfig(env="vime/Math-v0", output="o", n=8, k=k)


def test_bad_env_kwargs_are_refused():
    with pytest.raises(ConfigError, match="must be a JSON object"):
        EvalConfig(env="vime/Math-v0", output="o", env_kwargs="[1]")
    with pytest.raises(ConfigError, match="not JSON"):
        EvalConfig(env="vime/Math-v0", output="o", env_kwargs="{difficulty: hard}")


async def test_a_sampling_seed_is_sent_only_when_asked(stub_factory, task_file, tmp_path):
    rows = [("1+1", "2")]
    stub = await stub_factory(dict(rows))
    tasks = task_file(rows)
    await evaluate(config(tasks, tmp_path / "a", concurrency=1), base_url=stub.url, model="stub")
    assert stub.seeds == [None, None]
    await evaluate(
        config(tasks, tmp_path / "b", concurrency=1, seed=7), base_url=stub.url, model="stub"
    )
    assert stub.seeds[2:] == [7, 8]
