"""Episodes to scores: the one place where ``vime eval``, ``vime rollout`` and the in-loop
eval of ``vime train`` turn trajectories into result rows and pass@k, maj@k and mean reward
(the metrics themselves are defined in :mod:`vime.eval.metrics`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from vime.eval.metrics import is_correct
from vime.types import Trajectory

RESPONSE_CHARS = 2000  # of the last reply, kept per sample for reading failures later


def result_row(trajectory: Trajectory, *, threshold: float = 1.0) -> dict[str, Any]:
    """The results row of one episode; a failed or aborted episode scores 0 and is never
    correct, whatever it earned before it failed."""
    meta = trajectory.metadata
    failed = trajectory.error is not None
    reward = 0.0 if failed else float(trajectory.reward)
    replies = [m for m in trajectory.messages if m.get("role") == "assistant"]
    return {
        "task_id": trajectory.task_id,
        "sample_index": trajectory.sample_index,
        "reward": reward,
        "correct": not failed and is_correct(reward, meta.get("correct"), threshold),
        "answer": None if failed else meta.get("answer"),
        "error": trajectory.error,
        "turns": int(trajectory.metrics.get("num_turns", 0)),
        "finish_reason": meta.get("finish_reason", ""),
        "attempts": int(meta.get("attempts", 0)),
        "response": (replies[-1].get("content") or "")[-RESPONSE_CHARS:] if replies else "",
    }


def score(
    trajectories: Iterable[Trajectory], *, ks: Sequence[int] = (1,), threshold: float = 1.0
) -> dict[str, Any]:
    """The eval summary (pass@k, maj@k, mean reward, failures) of episodes grouped by task id;
    every k must be at most the group size."""
    from vime.eval.report import summarize

    rows = [result_row(t, threshold=threshold) for t in trajectories]
    if not rows:
        raise ValueError("score: no trajectories given")
    order = list(dict.fromkeys(r["task_id"] for r in rows))
    results = {(r["task_id"], r["sample_index"]): r for r in rows}
    n = max(r["sample_index"] for r in rows) + 1
    return summarize([{"id": t} for t in order], results, n=n, ks=list(ks))
