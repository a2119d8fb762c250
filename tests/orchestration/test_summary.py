"""The end-of-run summary: start vs end reward and held-out score, time split, output paths."""

from __future__ import annotations

from pathlib import Path

from vime.orchestration.summary import run_summary


def _history() -> list[dict[str, float]]:
    rows: list[dict[str, float]] = [{"step": 0, "eval/pass@1": 0.25, "time/eval_s": 4.0}]
    for step, reward in enumerate([0.0, 0.25, 0.25, 0.5, 0.5, 0.75, 0.5, 1.0], start=1):
        rows.append(
            {
                "step": step,
                "rollout/reward_mean": reward,
                "time/rollout_s": 10.0,
                "time/train_s": 20.0,
                "time/sync_s": 1.0,
            }
        )
    rows[-1].update({"eval/pass@1": 0.625, "time/eval_s": 4.0})
    return rows


def test_summary_reports_reward_and_held_out_score_at_start_and_end(tmp_path: Path) -> None:
    summary = run_summary(_history(), tmp_path, tmp_path / "tb")
    assert (summary["reward_first"], summary["reward_last"]) == (0.0, 1.0)
    # 8 steps: quarters of 2 steps, (0 + 0.25) / 2 and (0.5 + 1.0) / 2.
    assert summary["reward_first_quarter"] == 0.125
    assert summary["reward_last_quarter"] == 0.75
    assert summary["eval_first"] == (0, 0.25) and summary["eval_last"] == (8, 0.625)
    text = summary["text"]
    assert "reward: 0.000 at the first step -> 1.000 at the last" in text
    assert "(mean of the first 2 step(s) 0.125 -> last 2 0.750)" in text
    assert "held-out greedy pass@1: 0.250 at step 0 -> 0.625 at step 8" in text


def test_summary_splits_the_time_between_phases(tmp_path: Path) -> None:
    summary = run_summary(_history(), tmp_path, tmp_path / "tb")
    assert summary["time_s"] == {"rollout": 80.0, "train": 160.0, "sync": 8.0, "eval": 8.0}
    assert (
        "time per phase: rollout 80s (31%), train 160s (62%), sync 8s (3%), eval 8s (3%)"
        in (summary["text"])
    )


def test_summary_of_a_run_without_steps_names_only_the_outputs(tmp_path: Path) -> None:
    summary = run_summary([], tmp_path, tmp_path / "tb")
    assert summary["reward_first"] is None and summary["eval_last"] is None
    assert "reward:" not in summary["text"] and "time per phase" not in summary["text"]
    assert f"trajectory dumps: {tmp_path / 'trajectories'}" in summary["text"]
    assert f"browse the run: vime view {tmp_path}" in summary["text"]
