"""The run overview of the viewer, as static HTML: per-step curves of a train run from its
``metrics.jsonl``, or the pass@k curve, metrics and per-task rows of an eval."""

from __future__ import annotations

from html import escape
from typing import Any

# The eval report's own formatting, so both pages print a metric the same way.
from vime.eval.report import _fmt, _metric_names
from vime.eval.svg import line_chart, series_chart
from vime.orchestration.summary import PHASES

# (chart title, y label, {series name: metric key}) in the order the page shows them.
TRAIN_CHARTS: list[tuple[str, str, dict[str, str]]] = [
    ("reward", "mean reward", {"mean": "rollout/reward_mean"}),
    ("accuracy", "fraction correct", {"rollout": "rollout/accuracy"}),
    ("response length", "tokens", {"mean": "rollout/response_len_mean"}),
    (
        "rollout vs trainer logprob mismatch",
        "nats",
        {"mean |Δ logprob|": "mismatch/abs_diff_mean", "KL k3": "mismatch/kl_k3"},
    ),
    ("KL", "nats", {"policy approx KL": "policy/approx_kl", "KL to reference": "policy/kl_loss"}),
    ("entropy", "nats per token", {"entropy": "policy/entropy"}),
    ("grad norm", "L2 norm", {"grad norm": "train/grad_norm"}),
    ("time per phase", "seconds", {p: f"time/{p}_s" for p in PHASES}),
    (
        "eval points (held-out)",
        "score",
        {"pass@1": "eval/pass@1", "mean reward": "eval/mean_reward"},
    ),
]


def train_overview(history: list[dict[str, Any]]) -> str:
    """One chart per metric group that the run recorded; the rest are named as missing."""
    charts, missing = [], []
    for title, y_label, keys in TRAIN_CHARTS:
        series = {
            name: [
                (float(h.get("step", i)), float(h[key])) for i, h in enumerate(history) if key in h
            ]
            for name, key in keys.items()
        }
        series = {name: points for name, points in series.items() if points}
        if series:
            charts.append(series_chart(series, title=title, x_label="step", y_label=y_label))
        else:
            missing.append(title)
    note = f'<p class="note">not recorded: {escape(", ".join(missing))}</p>' if missing else ""
    if not history:
        return '<p class="note">no metrics.jsonl: no per-step curves</p>'
    steps = len({h.get("step") for h in history})
    return f'<p>{steps} logged steps.</p><div class="charts">{"".join(charts)}</div>{note}'


def eval_overview(summary: dict[str, Any] | None) -> str:
    """pass@k with its intervals, the headline metrics and one row per task (a task's name
    filters the trajectory list to it)."""
    if not summary:
        return '<p class="note">no summary.json yet (the eval has not finished)</p>'
    ks = sorted(int(k[5:]) for k in summary if k.startswith("pass@") and not k.endswith("_ci"))
    curve = [(k, summary[f"pass@{k}"]) for k in ks if summary.get(f"pass@{k}") is not None]
    cis = [summary.get(f"pass@{k}_ci") for k, _ in curve]
    chart = line_chart(curve, cis, title="pass@k", x_label="k", y_label="pass@k")
    metric_rows = "".join(
        f"<tr><td>{escape(name)}</td><td>{escape(_fmt(summary.get(name)))}</td><td>{_ci(summary, name)}</td></tr>"
        for name in _metric_names(summary)
    )
    tasks = summary.get("tasks") or []
    cols = [c for c in (tasks[0] if tasks else {}) if c != "task_id"]
    rows = "".join(
        f'<tr><td><button class="task-link" data-task="{escape(str(t["task_id"]))}">'
        f"{escape(str(t['task_id']))}</button></td>"
        + "".join(f"<td>{escape(_fmt(t.get(c)))}</td>" for c in cols)
        + "</tr>"
        for t in tasks
    )
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    return (
        f"<p>{summary.get('num_tasks')} tasks &times; {escape(str(summary.get('n')))} samples, "
        f"{summary.get('num_samples')}/{summary.get('num_expected')} recorded, "
        f"{summary.get('num_failed')} failed.</p>"
        f'<div class="charts">{chart}<table class="metrics"><tr><th>metric</th><th>value</th>'
        f"<th>95% CI</th></tr>{metric_rows}</table></div>"
        f'<details open><summary>{len(tasks)} tasks</summary><div class="task-table">'
        f"<table><tr><th>task</th>{head}</tr>{rows}</table></div></details>"
    )


def _ci(summary: dict[str, Any], name: str) -> str:
    ci = summary.get(f"{name}_ci")
    return f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "n/a"
