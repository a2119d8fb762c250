"""The summary of an eval (pass@k, maj@k, mean reward with bootstrap CIs, failures, per-task
rows) and its reports: ``summary.json``, ``report.md`` and a self-contained ``report.html``."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from vime.eval.metrics import bootstrap_ci, maj_at_k, pass_at_k
from vime.eval.svg import bar_chart, line_chart


def summarize(
    tasks: list[dict[str, Any]],
    results: dict[tuple[str, int], dict[str, Any]],
    *,
    n: int,
    ks: list[int],
) -> dict[str, Any]:
    """Metrics over the recorded samples of ``tasks`` (failed samples count as incorrect).

    pass@k is the unbiased estimator per task averaged over tasks; maj@k is reported when
    the env gives comparable answers (``answer_key`` or ``extracted_answer``; see
    :data:`MAJ_AT_K_DEFINITION`); each metric has a 95% bootstrap
    interval over tasks under ``<metric>_ci``.
    """
    per_task = []
    rows_all = []
    for task in tasks:
        task_id = str(task["id"])
        rows = [results[(task_id, i)] for i in range(n) if (task_id, i) in results]
        rows_all.extend(rows)
        correct = [bool(r["correct"]) for r in rows]
        entry: dict[str, Any] = {
            "task_id": task_id,
            "samples": len(rows),
            "correct": sum(correct),
            "failed": sum(r.get("error") is not None for r in rows),
            "mean_reward": math.fsum(r["reward"] for r in rows) / len(rows) if rows else None,
            "answers": [r.get("answer") for r in rows],
            "correct_flags": correct,
        }
        for k in ks:
            entry[f"pass@{k}"] = pass_at_k(len(rows), sum(correct), k) if len(rows) >= k else None
        per_task.append(entry)
    comparable = any(r.get("answer") is not None for r in rows_all)
    summary: dict[str, Any] = {
        "num_tasks": len(tasks),
        "n": n,
        "num_samples": len(rows_all),
        "num_expected": len(tasks) * n,
        "complete": len(rows_all) == len(tasks) * n,
        "num_failed": sum(r.get("error") is not None for r in rows_all),
        "failures": dict(Counter(_reason(r["error"]) for r in rows_all if r.get("error"))),
    }
    for k in ks:
        _metric(summary, f"pass@{k}", [t[f"pass@{k}"] for t in per_task])
    if comparable:
        for k in ks:
            values = []
            for t in per_task:
                if t["samples"] >= k:
                    t[f"maj@{k}"] = maj_at_k(t["answers"], t["correct_flags"], k)
                    values.append(t[f"maj@{k}"])
            _metric(summary, f"maj@{k}", values)
    _metric(summary, "mean_reward", [t["mean_reward"] for t in per_task])
    for t in per_task:
        del t["answers"], t["correct_flags"]
    summary["rewards"] = [r["reward"] for r in rows_all]
    summary["tasks"] = per_task
    return summary


MAJ_AT_K_DEFINITION = (
    "maj@k: a plurality vote over each task's first k samples, on answer classes formed by the "
    "env's own grader (every answer it graded right is one class, whatever its written form; "
    "a wrong one votes for its canonical answer); an unparsable or rejected answer votes "
    '"invalid", which can win and then scores 0; ties go to the class seen first.'
)


def _metric(summary: dict[str, Any], name: str, values: list[float | None]) -> None:
    present = [v for v in values if v is not None]
    if not present:
        summary[name] = None
        return
    ci = bootstrap_ci(present)
    summary[name] = ci.estimate
    summary[f"{name}_ci"] = [ci.low, ci.high]


def _reason(error: str) -> str:
    return error.split(":", 1)[0]


def write_reports(directory: str | Path, summary: dict[str, Any], identity: dict[str, Any]) -> None:
    """Write ``summary.json``, ``report.md`` and ``report.html`` into ``directory``."""
    directory = Path(directory)
    meta = {k: identity[k] for k in ("env", "model", "n", "temperature", "max_tokens")}
    out = {**meta, **{k: v for k, v in summary.items() if k != "rewards"}}
    (directory / "summary.json").write_text(json.dumps(out, indent=2))
    (directory / "report.md").write_text(markdown(summary, meta))
    (directory / "report.html").write_text(html(summary, meta))


def _metric_names(summary: dict[str, Any]) -> list[str]:
    return [k for k in summary if k.startswith(("pass@", "maj@")) and not k.endswith("_ci")] + [
        "mean_reward"
    ]


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    """The report as Markdown: headline metrics with CIs, failures and the per-task table."""
    lines = [f"# Eval of {meta['model']} on {meta['env']}", ""]
    lines.append(
        f"{summary['num_tasks']} tasks x {meta['n']} samples (temperature {meta['temperature']}, "
        f"max_tokens {meta['max_tokens']}); {summary['num_samples']}/{summary['num_expected']} "
        f"recorded, {summary['num_failed']} failed (counted as incorrect)."
    )
    lines += ["", "| metric | value | 95% CI |", "|---|---|---|"]
    for name in _metric_names(summary):
        ci = summary.get(f"{name}_ci")
        span = f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "n/a"
        lines.append(f"| {name} | {_fmt(summary[name])} | {span} |")
    if any(name.startswith("maj@") for name in summary):
        lines += ["", MAJ_AT_K_DEFINITION]
    if summary["failures"]:
        lines += ["", "## Failures", "", "| reason | samples |", "|---|---|"]
        lines += [f"| {r} | {c} |" for r, c in sorted(summary["failures"].items())]
    cols = [c for c in summary["tasks"][0] if c != "task_id"] if summary["tasks"] else []
    lines += ["", "## Tasks", "", "| task | " + " | ".join(cols) + " |"]
    lines.append("|---" * (len(cols) + 1) + "|")
    for t in summary["tasks"]:
        lines.append(f"| {t['task_id']} | " + " | ".join(_fmt(t[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _esc(value: Any) -> str:
    import html as html_lib

    return html_lib.escape(str(value), quote=True)


def html(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG, no scripts)."""
    ks = sorted(int(k[5:]) for k in summary if k.startswith("pass@") and not k.endswith("_ci"))
    curve = [(k, summary[f"pass@{k}"]) for k in ks if summary[f"pass@{k}"] is not None]
    cis = [summary.get(f"pass@{k}_ci") for k, _ in curve]
    pass_svg = line_chart(curve, cis, title="pass@k", x_label="k", y_label="pass@k")
    hist_svg = bar_chart(_histogram(summary["rewards"]), title="reward per sample")
    metric_rows = "".join(
        f"<tr><td>{_esc(name)}</td><td>{_fmt(summary[name])}</td><td>"
        + (
            f"[{summary[name + '_ci'][0]:.4f}, {summary[name + '_ci'][1]:.4f}]"
            if summary.get(name + "_ci")
            else "n/a"
        )
        + "</td></tr>"
        for name in _metric_names(summary)
    )
    failures = "".join(
        f"<tr><td>{_esc(r)}</td><td>{c}</td></tr>" for r, c in sorted(summary["failures"].items())
    )
    cols = [c for c in summary["tasks"][0] if c != "task_id"] if summary["tasks"] else []
    task_rows = "".join(
        f"<tr><td>{_esc(t['task_id'])}</td>"
        + "".join(f"<td>{_fmt(t[c])}</td>" for c in cols)
        + "</tr>"
        for t in summary["tasks"]
    )
    title = f"Eval of {meta['model']} on {meta['env']}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
.plots {{ display: flex; gap: 2em; flex-wrap: wrap; }}
</style></head><body>
<h1>{_esc(title)}</h1>
<p>{summary["num_tasks"]} tasks &times; {_esc(meta["n"])} samples (temperature
{_esc(meta["temperature"])}, max_tokens {_esc(meta["max_tokens"])});
{summary["num_samples"]}/{summary["num_expected"]} recorded, {summary["num_failed"]} failed
(counted as incorrect).</p>
<table><tr><th>metric</th><th>value</th><th>95% CI</th></tr>{metric_rows}</table>
{"<p>" + _esc(MAJ_AT_K_DEFINITION) + "</p>" if any(k.startswith("maj@") for k in summary) else ""}
{"<h2>Failures</h2><table><tr><th>reason</th><th>samples</th></tr>" + failures + "</table>" if failures else ""}
<div class="plots">{pass_svg}{hist_svg}</div>
<h2>Tasks</h2>
<table><tr><th>task</th>{"".join(f"<th>{_esc(c)}</th>" for c in cols)}</tr>{task_rows}</table>
</body></html>
"""


def _histogram(values: list[float], bins: int = 10) -> list[tuple[str, int]]:
    """(label, count) bins over the range of ``values``; one bin per value when few distinct."""
    if not values:
        return []
    distinct = sorted(set(values))
    if len(distinct) <= bins:
        counts = Counter(values)
        return [(f"{v:g}", counts[v]) for v in distinct]
    low, high = distinct[0], distinct[-1]
    width = (high - low) / bins
    counts = [0] * bins
    for v in values:
        counts[min(int((v - low) / width), bins - 1)] += 1
    return [(f"{low + i * width:.2g}", c) for i, c in enumerate(counts)]
