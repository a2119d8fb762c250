"""The end-of-run summary of ``vime train``: metric table, reward and held-out score at the
start vs the end, where the time went, and where the outputs are."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from vime.orchestration.metrics_log import summary_table

SUMMARY_KEYS = [
    "rollout/reward_mean",
    "rollout/accuracy",
    "rollout/response_len_mean",
    "train/loss",
    "train/grad_norm",
    "mismatch/abs_diff_mean",
    "eval/mean_reward",
    "eval/pass@1",
    "time/rollout_s",
    "time/train_s",
    "time/sync_s",
]
PHASES = ("rollout", "train", "sync", "eval")


def _series(history: list[dict[str, float]], key: str) -> list[tuple[int, float]]:
    return [(int(h.get("step", i)), h[key]) for i, h in enumerate(history) if key in h]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def run_summary(
    history: list[dict[str, float]], out: Path, tensorboard_dir: Path | str
) -> dict[str, Any]:
    """The summary of a run from its per-step metrics (``history``), as text and numbers.

    Per-step rewards of a small batch are noisy, so besides the first and last step the
    means of the first and last quarter of the steps are reported.
    """
    rewards = [v for _, v in _series(history, "rollout/reward_mean")]
    evals = _series(history, "eval/pass@1")
    totals = {p: sum(h.get(f"time/{p}_s", 0.0) for h in history) for p in PHASES}
    text = [summary_table(history, SUMMARY_KEYS)]
    summary: dict[str, Any] = {
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "eval_first": evals[0] if evals else None,
        "eval_last": evals[-1] if len(evals) > 1 else None,
        "time_s": totals,
        "history": history,
    }
    if rewards:
        q = max(1, len(rewards) // 4)
        summary["reward_first_quarter"] = _mean(rewards[:q])
        summary["reward_last_quarter"] = _mean(rewards[-q:])
        text.append(
            f"reward: {rewards[0]:.3f} at the first step -> {rewards[-1]:.3f} at the last "
            f"(mean of the first {q} step(s) {summary['reward_first_quarter']:.3f} -> last "
            f"{q} {summary['reward_last_quarter']:.3f})"
        )
    if len(evals) > 1:
        (s0, e0), (s1, e1) = evals[0], evals[-1]
        text.append(f"held-out greedy pass@1: {e0:.3f} at step {s0} -> {e1:.3f} at step {s1}")
    spent = sum(totals.values())
    if spent > 0:
        parts = [
            f"{p} {totals[p]:.0f}s ({100 * totals[p] / spent:.0f}%)" for p in PHASES if totals[p]
        ]
        text.append("time per phase: " + ", ".join(parts))
    text.append(f"TensorBoard logs: {tensorboard_dir}  (tensorboard --logdir {tensorboard_dir})")
    text.append(f"trajectory dumps: {out / 'trajectories'}")
    text.append(f"browse the run: vime view {shlex.quote(str(out))}")
    text.append(f"checkpoints: {out / 'checkpoints'}; exported HF model: {out / 'exports'}")
    summary["text"] = "\n".join(text)
    return summary
