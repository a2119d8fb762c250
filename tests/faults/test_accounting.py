"""The harness's counts: a lost episode, a reasonless failure and a twice-trained step are seen."""

from __future__ import annotations

import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _episode(status: str = "completed", error: str | None = None) -> dict:
    return {"status": status, "error": error, "metrics": {}}


def test_missing_and_reasonless_episodes_and_twice_trained_steps_are_counted(faults, tmp_path):
    run = faults.Run(tmp_path / "case", "sync", steps=2)
    _write(run.out / "metrics.jsonl", [{"step": 1, "time": 10.0}, {"step": 2, "time": 20.0}])
    _write(
        run.out / "trajectories" / "step_000001.jsonl",
        [_episode(), _episode(), _episode("failed", "RuntimeError: boom"), _episode("aborted")],
    )
    _write(run.out / "trajectories" / "step_000002.jsonl", [_episode()] * 3)  # one missing
    trained = [{"step": 0, "sample_id": "a"}, {"step": 1, "sample_id": "b"}]
    _write(run.out / "trained_samples.jsonl", [*trained, {"step": 1, "sample_id": "a"}])
    o = faults.account(run, faults.Outcome("none", "sync"), fault_at=15.0)
    assert (o.lost_silently, o.failed_with_reason, o.steps_twice) == (2, 1, 2)
    assert o.recover_s == 5.0 and o.leftovers == 0 and not o.finished


def test_the_table_has_one_row_per_fault_with_every_column(faults):
    outcomes = [
        faults.Outcome("engine kill -9", "sync", finished=True, recover_s=12.0),
        faults.Outcome("engine kill -9", "async", finished=False, lost_silently=1, leftovers=2),
        faults.Outcome("driver SIGKILL", "sync", True, extra={"leftovers_after_kill": 3}),
    ]
    lines = faults.table(outcomes).splitlines()
    assert len(lines) == 4
    assert lines[2] == "| engine kill -9 | sync, async | 1/2 | 1 | 0 | 0 | 0 (0) | 12 | 2 |"
    assert lines[3].endswith("| 3 |")  # left 20 s after the kill, before the resume


def test_a_run_the_harness_fails_on_is_recorded_unfinished_and_the_matrix_goes_on(
    faults, tmp_path, monkeypatch, capsys
):
    def missed(run, rng):
        raise RuntimeError("the run ended before a request ran on the engine: fault missed")

    def survived(run, rng):
        return faults.Outcome("fine", run.mode, finished=True)

    monkeypatch.setattr(faults, "FAULTS", {"flaky": missed, "fine": survived})
    monkeypatch.setattr(faults.Run, "leftovers", lambda self, grace_s=20.0: 0)
    monkeypatch.setattr(faults, "_tiny_model", lambda path: path)
    argv = ["faults.py", "--faults", "flaky,fine", "--modes", "sync", "--repeats", "2"]
    monkeypatch.setattr("sys.argv", [*argv, "--out", str(tmp_path)])
    faults.main()
    rows = [json.loads(x) for x in (tmp_path / "outcomes.jsonl").read_text().splitlines()]
    expected = [("flaky", False), ("flaky", False), ("fine", True), ("fine", True)]
    assert [(r["fault"], r["finished"]) for r in rows] == expected
    assert rows[1]["point"] == "seed 1" and "fault missed" in rows[1]["message"]
    assert "| flaky | sync | 0/2 |" in capsys.readouterr().out


def test_a_fault_finds_its_target_before_its_delay_and_a_finished_run_fails_at_once(
    faults, tmp_path, monkeypatch
):
    import random
    import subprocess
    import sys
    import time

    monkeypatch.setattr(faults, "_tiny_model", lambda path: path)
    run = faults.Run(tmp_path / "case", "sync", steps=4)
    _write(run.out / "metrics.jsonl", [{"step": 1, "time": 10.0}])
    run.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        looked_up = []
        target, point = faults._mid_step(run, random.Random(0), lambda: looked_up.append(1) or [7])
        assert target == [7] and looked_up == [1] and point.startswith("step 2 +")
        assert float(point.split("+")[1].rstrip("s")) <= 1.0  # under one step of the tiny run
    finally:
        run.proc.kill()
        run.proc.wait()
    # The run is over and its target is gone: an error now, not a 60 s wait (CI's failure).
    started = time.monotonic()
    try:
        faults._mid_step(run, random.Random(0), lambda: [])
    except RuntimeError as exc:
        assert "the run ended" in str(exc) and "the fault's target" in str(exc)
    else:
        raise AssertionError("a finished run must fail the fault at once")
    assert time.monotonic() - started < 5


def test_the_fault_env_never_fails_every_episode_of_a_step():
    """A step of 4 episodes all taking the fault stops the run as a broken setup (CI hit it
    with a free 30% draw); the draw caps the faults in a row so every 4 resets hold a clean
    one, at a rate still near 30% (less the capped runs)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fault_env", BENCH / "fault_env.py")
    env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(env)
    draws = [env.draw_fault("reset") for _ in range(20_000)]
    faulty = [d == "reset" for d in draws]
    assert set(draws) == {"reset", None}
    assert 0.22 < sum(faulty) / len(faulty) < 0.3
    window = env.MAX_IN_A_ROW + 1
    assert not any(all(faulty[i : i + window]) for i in range(len(faulty) - window + 1))
    assert any(all(faulty[i : i + env.MAX_IN_A_ROW]) for i in range(len(faulty)))  # cap reached
    assert env.draw_fault(None) is None  # a task without a fault never gets one
