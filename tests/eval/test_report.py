"""Eval summaries on hand-made results, and the HTML report rendered in headless Chromium."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess

import pytest

from vime.eval.metrics import pass_at_k
from vime.eval.report import html, markdown, summarize, write_reports

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def row(task_id: str, index: int, correct: bool, answer=None, error=None, reward=None) -> dict:
    reward = float(correct) if reward is None else reward
    return {
        "task_id": task_id,
        "sample_index": index,
        "correct": correct,
        "reward": reward,
        "answer": answer,
        "error": error,
    }


def results(*rows: dict) -> dict:
    return {(r["task_id"], r["sample_index"]): r for r in rows}


def test_summary_on_hand_made_results():
    tasks = [{"id": "a"}, {"id": "b"}]
    data = results(
        row("a", 0, False, "3"),
        row("a", 1, True, "4"),
        row("a", 2, False, "3"),
        row("a", 3, True, "4"),
        row("b", 0, False, None, error="timeout: slow"),
        row("b", 1, False, "7"),
        row("b", 2, True, "8"),
        row("b", 3, False, "7"),
    )
    s = summarize(tasks, data, n=4, ks=[1, 2, 4])
    assert s["pass@1"] == pytest.approx((0.5 + 0.25) / 2)
    assert s["pass@2"] == pytest.approx((pass_at_k(4, 2, 2) + pass_at_k(4, 1, 2)) / 2)
    assert s["pass@4"] == 1.0
    # maj@2: a votes 3 (first seen on a tie) -> wrong; b has one answer, 7 -> wrong.
    assert s["maj@2"] == 0.0
    # maj@4: a ties 3 vs 4 -> 3 (first) -> wrong; b: 7 twice -> wrong.
    assert s["maj@4"] == 0.0
    assert s["maj@1"] == 0.0
    assert s["mean_reward"] == pytest.approx(3 / 8)
    assert s["num_failed"] == 1 and s["failures"] == {"timeout": 1}
    assert s["complete"] and s["num_samples"] == 8
    low, high = s["pass@1_ci"]
    assert 0.25 <= low <= s["pass@1"] <= high <= 0.5
    assert [t["correct"] for t in s["tasks"]] == [2, 1]


def test_maj_at_k_is_left_out_without_comparable_answers():
    s = summarize([{"id": "a"}], results(row("a", 0, True), row("a", 1, False)), n=2, ks=[1, 2])
    assert "maj@1" not in s and s["pass@2"] == 1.0


def test_an_incomplete_run_is_reported_as_such():
    s = summarize([{"id": "a"}, {"id": "b"}], results(row("a", 0, True)), n=2, ks=[1, 2])
    assert not s["complete"] and s["num_samples"] == 1 and s["num_expected"] == 4
    assert s["pass@1"] == 1.0 and s["pass@2"] is None


def test_html_escapes_task_ids_and_has_no_script():
    s = summarize([{"id": "<b>x</b>"}], results(row("<b>x</b>", 0, True)), n=1, ks=[1])
    page = html(s, {"model": "m&m", "env": "e", "n": 1, "temperature": 1.0, "max_tokens": 8})
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page and "m&amp;m" in page
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")


def render(page, tmp_path) -> tuple[bytes, list[str]]:
    """Screenshot ``page`` in headless Chromium; return the PNG and its console messages."""
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [
            CHROMIUM,
            *("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"),
            *("--disable-component-update", "--disable-sync", "--no-first-run"),
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1200,1600",
            "--enable-logging=stderr",
            "--v=0",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return shot.read_bytes(), re.findall(r"CONSOLE[^\n]*", proc.stderr)


def pixels(png: bytes):
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20) or []
    return image.size, colours


def test_console_errors_are_seen_by_the_check(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text("<html><body><p>x</p><script>missing_function();</script></body></html>")
    _, console = render(page, tmp_path)
    assert any("missing_function is not defined" in line for line in console), console


def test_report_html_renders_in_headless_chromium(tmp_path):
    tasks = [{"id": f"task-{i}"} for i in range(6)]
    rows = [
        row(f"task-{i}", s, (i + s) % 3 == 0, str((i + s) % 2), reward=((i + s) % 5) / 4)
        for i in range(6)
        for s in range(4)
    ]
    rows[0]["error"] = "rate_limited: HTTP 429"
    summary = summarize(tasks, results(*rows), n=4, ks=[1, 2, 4])
    identity = {"env": "vime/Math-v0", "model": "tiny", "n": 4, "temperature": 1.0}
    write_reports(tmp_path, summary, {**identity, "max_tokens": 64})
    page = (tmp_path / "report.html").read_text()
    assert page.count("<svg") == 2 and "task-5" in page and "rate_limited" in page
    png, console = render(tmp_path / "report.html", tmp_path)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    size, colours = pixels(png)
    assert size == (1200, 1600)
    assert len(colours) > 20  # text, lines, both charts' colours: not a blank page
    non_white = sum(count for count, rgb in colours if rgb != (255, 255, 255))
    assert non_white > 0.01 * size[0] * size[1]
    assert console == []
    assert json.loads((tmp_path / "summary.json").read_text())["num_failed"] == 1


def test_the_report_states_the_maj_at_k_definition():
    rows = results(row("a", 0, True, "7"), row("a", 1, False, None), row("a", 2, False, None))
    s = summarize([{"id": "a"}], rows, n=3, ks=[3])
    assert s["maj@3"] == 0.0  # two unparsable answers: "invalid" wins
    meta = {"model": "m", "env": "e", "n": 3, "temperature": 1.0, "max_tokens": 8}
    assert 'votes "invalid", which can win' in markdown(s, meta)
    assert "votes &quot;invalid&quot;, which can win" in html(s, meta)
