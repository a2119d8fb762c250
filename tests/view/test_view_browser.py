"""The viewer page driven in headless Chromium: it renders, filters, shows an episode's tokens
with the dump's loss mask and logprobs, compares best and worst, runs no model text, and opens
a 20,000-episode run fast (slow test)."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest
from browser import Browser
from synth_run import HOSTILE, make_run

from vime.view import build, write_view
from vime.view.serve import make_server

TRAINED = "rgb(42, 111, 219)"  # .tok.m1 underline
NOT_TRAINED = "rgb(136, 136, 136)"  # .tok.m0 text colour
ROWS_TEXT = "[...document.querySelectorAll('#list .row')].map(r => r.textContent)"


def dump_records(run: Path) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted((run / "trajectories").glob("step_*.jsonl"))
        for line in path.read_text().splitlines()
    ]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run = make_run(tmp_path_factory.mktemp("run"), steps=4, groups=6, n=4)
    write_view(run)
    return run


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with Browser(tmp_path_factory.mktemp("profile")) as b:
        yield b


@pytest.fixture
def page(browser, run):
    browser.errors.clear()
    browser.open((run / "view.html").as_uri())
    browser.wait_for("window.vimeTimings && window.vimeTimings.listReady")
    return browser


def set_input(b: Browser, element_id: str, value: str) -> None:
    event = "change" if element_id in ("f-env", "f-status", "f-sort") else "input"
    b.js(
        f"(() => {{ const e = document.getElementById({json.dumps(element_id)}); "
        f"e.value = {json.dumps(value)}; e.dispatchEvent(new Event('{event}')); }})()"
    )


def count(b: Browser) -> int:
    return int(b.js("document.getElementById('count').textContent").split()[0])


def open_row(b: Browser, k: int) -> None:
    b.js(f"document.querySelectorAll('#list .row')[{k}].click()")
    b.wait_for("!!document.querySelector('#detail .tokens')")


def tokens(b: Browser) -> list[dict]:
    return b.js(
        "[...document.querySelectorAll('#detail .tokens .tok')].map(s => ({"
        "text: s.textContent, cls: s.className, lp: s.getAttribute('data-lp'),"
        "tlp: s.getAttribute('data-tlp'), under: getComputedStyle(s).borderBottomColor,"
        "colour: getComputedStyle(s).color}))"
    )


def test_page_renders_without_console_errors(page):
    from PIL import Image

    page.js("document.querySelector('#list .row').click()")
    page.wait_for("!!document.querySelector('#detail .tokens')")
    image = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20) or []
    non_white = sum(n for n, rgb in colours if rgb != (255, 255, 255))
    assert len(colours) > 50 and non_white > 0.2 * image.size[0] * image.size[1]
    assert page.js("document.querySelectorAll('#overview svg').length") == 9
    assert page.errors == []


def test_filters_narrow_the_list(page, run):
    records = dump_records(run)
    assert count(page) == len(records) == 96
    set_input(page, "f-step-min", "2")
    set_input(page, "f-step-max", "2")
    assert count(page) == sum(r["step"] == 2 for r in records) == 24
    assert all(text.startswith("s2") for text in page.js(ROWS_TEXT))
    set_input(page, "f-reward-min", "1")
    assert count(page) == sum(r["step"] == 2 and r["reward"] >= 1 for r in records)
    for element in ("f-step-min", "f-step-max", "f-reward-min"):
        set_input(page, element, "")
    truncated = page.js(
        "[...document.getElementById('f-status').options].find(o => o.text === 'truncated').value"
    )
    set_input(page, "f-status", truncated)
    assert count(page) == sum(r["status"] == "truncated" for r in records) > 0
    set_input(page, "f-status", "")
    set_input(page, "f-text", "the answer is 12")
    wanted = [r for r in records if "the answer is 12" in r["messages"][-1]["content"]]
    assert count(page) == len(wanted) > 0
    # Text only the user's message holds is found in whole episodes, not in the index.
    set_input(page, "f-text", "task 9: what is 9 + 1")
    assert count(page) == 0
    page.js("document.getElementById('f-deep').click()")
    page.wait_for("window.vimeTimings.scanned")
    assert count(page) == sum(
        "task 9: what is 9 + 1" in r["messages"][1]["content"] for r in records
    )
    assert count(page) == 4
    page.js("document.getElementById('f-deep').click()")
    set_input(page, "f-text", "")
    set_input(page, "f-task", "task-9")
    assert count(page) == sum(r["task_id"] == "task-9" for r in records) == 4
    assert page.errors == []


def test_an_opened_episode_shows_the_dump_tokens_mask_and_logprobs(page, run):
    records = dump_records(run)
    set_input(page, "f-step-min", "3")
    open_row(page, 5)
    record = [r for r in records if r["step"] >= 3][5]
    shown = tokens(page)
    assert len(shown) == len(record["token_ids"])
    assert [1 if "m1" in t["cls"] else 0 for t in shown] == record["loss_mask"]
    for t, m in zip(shown, record["loss_mask"], strict=True):
        # Trained tokens are underlined in blue; prompt, env and tool tokens are grey.
        assert (t["under"], t["colour"] != NOT_TRAINED) == (
            (TRAINED, True) if m else ("rgba(0, 0, 0, 0)", False)
        )
    sampled = [i for i, m in enumerate(record["loss_mask"]) if m]
    trainer = record["metadata"]["trainer_logprobs"]
    for i in sampled:
        assert float(shown[i]["lp"]) == pytest.approx(record["logprobs"][i], abs=1e-6)
        assert float(shown[i]["tlp"]) == pytest.approx(trainer[i], abs=1e-6)
    # The token texts are the tokenizer's pieces of the dump's ids.
    vocab = json.loads((run / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    piece = {i: w for w, i in vocab.items()}
    assert [t["text"] for t in shown] == [
        piece[i].replace("\n", "↵\n") for i in record["token_ids"]
    ]
    heading = page.js("document.querySelector('#detail h2').textContent")
    assert heading == f"{record['task_id']} #{record['sample_index']}"
    assert page.errors == []


def test_drift_marks_stand_before_the_token_where_the_ids_were_replaced(page, run):
    records = dump_records(run)
    k, record = next((k, r) for k, r in enumerate(records) if r["metadata"].get("drift_at"))
    page.js(f"document.getElementById('list').scrollTop = {k} * 26")
    page.js(f"document.querySelector('#list .row[data-i=\"{k}\"]').click()")
    page.wait_for("!!document.querySelector('#detail .tokens')")
    before = page.js(
        "(() => { const d = document.querySelector('#detail .tokens .drift'); let n = 0;"
        "for (let s = d.previousElementSibling; s; s = s.previousElementSibling)"
        "  if (s.classList.contains('tok')) n++; return n; })()"
    )
    assert before == record["metadata"]["drift_at"][0]
    assert "drift ×1" in page.js("document.querySelector('#detail .badges').textContent")
    assert page.errors == []


def test_model_text_with_script_and_html_runs_nothing(page, run):
    set_input(page, "f-text", "window.__pwned")
    assert count(page) > 0
    open_row(page, 0)
    text = page.js("document.getElementById('detail').textContent")
    assert HOSTILE in text and "<b>bold?</b>" in text  # shown literally, as text
    assert (
        page.js("document.querySelectorAll('#detail img, #detail b, #detail script').length") == 0
    )
    assert page.js("typeof window.__pwned") == "undefined"
    assert page.errors == []


def test_best_and_worst_of_a_group_side_by_side(page, run):
    records = dump_records(run)
    set_input(page, "f-task", "task-10")
    open_row(page, 0)
    page.js("document.querySelector('.compare-btn').click()")
    page.wait_for("document.querySelectorAll('.compare .tokens').length === 2")
    group = [r for r in records if r["task_id"] == "task-10"]
    best = max(group, key=lambda r: r["reward"])
    worst = min(group, key=lambda r: r["reward"])
    titles = page.js(
        "[...document.querySelectorAll('.compare > div > div > h2:first-child')].map(h => h.textContent)"
    )
    assert titles == [f"task-10 #{best['sample_index']}", f"task-10 #{worst['sample_index']}"]
    assert page.errors == []


def test_served_page_loads_episodes_over_http(browser, run):
    server = make_server(*build(run), host="127.0.0.1", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        browser.errors.clear()
        browser.open(f"http://127.0.0.1:{server.server_address[1]}/#t=50")
        browser.wait_for("!!document.querySelector('#detail .tokens')")
        record = dump_records(run)[50]
        assert len(tokens(browser)) == len(record["token_ids"])
        assert browser.errors == []
    finally:
        server.shutdown()
        server.server_close()


def test_an_eval_page_filters_by_the_task_row_clicked(browser, tmp_path):
    from vime.eval.report import summarize, write_reports

    rows = [
        {"task_id": f"t{i}", "sample_index": s, "reward": float(s < i), "correct": s < i,
         "answer": None, "error": None, "response": f"<i>reply</i> {i}/{s}"}
        for i in range(4)
        for s in range(3)
    ]  # fmt: skip
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = summarize(
        [{"id": f"t{i}"} for i in range(4)],
        {(r["task_id"], r["sample_index"]): r for r in rows},
        n=3,
        ks=[1, 3],
    )
    identity = {"env": "vime/Math-v0", "model": "m", "n": 3, "temperature": 1.0, "max_tokens": 8}
    write_reports(tmp_path, summary, identity)
    browser.errors.clear()
    browser.open(write_view(tmp_path).as_uri())
    browser.wait_for("window.vimeTimings && window.vimeTimings.listReady")
    assert count(browser) == 12
    browser.js("document.querySelector('.task-link[data-task=\"t2\"]').click()")
    assert count(browser) == 3
    browser.js("document.querySelectorAll('#list .row')[1].click()")
    browser.wait_for("!!document.querySelector('#detail .msg pre')")
    assert (
        browser.js("document.querySelector('#detail .msg pre').textContent") == "<i>reply</i> 2/1"
    )
    assert browser.errors == []


@pytest.mark.slow
def test_twenty_thousand_episodes_open_and_filter_within_two_seconds(tmp_path, browser):
    """About 150 MB of dumps (50 steps x 100 groups x 4): the page must show the list, answer
    a filter and open an episode each in under 2 s."""
    run = make_run(tmp_path / "big", steps=50, groups=100, n=4)
    dumps = sum(p.stat().st_size for p in (run / "trajectories").iterdir())
    assert dumps > 140e6
    started = time.monotonic()
    page_path = write_view(run)
    built = time.monotonic() - started
    browser.errors.clear()
    started = time.monotonic()
    browser.open(page_path.as_uri())
    loaded = time.monotonic() - started
    ready = browser.wait_for("window.vimeTimings && window.vimeTimings.listReady")
    assert count(browser) == 20_000
    filtered = browser.js(
        "(async () => { const t = performance.now(); const f = document.getElementById('f-text');"
        "f.value = 'the answer is 140'; f.dispatchEvent(new Event('input'));"
        "await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));"
        "return performance.now() - t; })()"
    )
    assert 0 < count(browser) < 20_000
    started = time.monotonic()
    browser.js("document.getElementById('f-deep').click()")
    browser.wait_for("window.vimeTimings.scanned", timeout=120)
    scanned = time.monotonic() - started
    opened = browser.js(
        "(async () => { const t = performance.now(); const rows = document.querySelectorAll('.row');"
        "rows[rows.length - 1].click();"
        "while (!document.querySelector('#detail .tokens')) await new Promise(r => setTimeout(r, 5));"
        "return performance.now() - t; })()"
    )
    print(
        f"\n20k episodes: dumps {dumps / 1e6:.0f} MB, page {page_path.stat().st_size / 1e6:.0f} MB "
        f"built in {built:.1f}s; load event {loaded:.2f}s, list ready {ready / 1000:.2f}s, "
        f"filter {filtered:.0f} ms, open {opened:.0f} ms, whole-episode text search {scanned:.1f}s"
    )
    assert loaded < 2 and ready < 2000 and filtered < 2000 and opened < 2000
    assert browser.errors == []
