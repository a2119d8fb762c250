"""``vime view`` without a browser: what the page packs (index and chunks) must be the dump's
own values, every input kind is recognised, and run text cannot break out of its data block."""

from __future__ import annotations

import gzip
import json
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from synth_run import HOSTILE, make_run

from vime.cli.main import main
from vime.errors import ConfigError
from vime.view import build, open_run, write_view
from vime.view.index import CHUNK, pack
from vime.view.serve import make_server


def dump_records(run: Path) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted((run / "trajectories").glob("step_*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def decode_chunk(data: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """The chunk layout documented in vime.view.index, read independently with numpy."""
    raw = gzip.decompress(data)
    length = int.from_bytes(raw[:4], "little")
    head = json.loads(raw[4 : 4 + length])
    off = 4 + length
    assert off % 4 == 0, "typed arrays must start 4-byte aligned"
    arrays = {}
    names = [("ids", "<i4", head["n"]), ("lp", "<f4", head["m"])]
    names += [("tlp", "<f4", head["m"])] if head["trainer"] else []
    names += [("ver", "<i4", head["m"]), ("mask", "u1", head["n"])]
    for name, dtype, count in names:
        arrays[name] = np.frombuffer(raw, dtype=dtype, count=count, offset=off)
        off += arrays[name].nbytes
    assert off == len(raw)
    return head, arrays


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("run"), steps=3, groups=5, n=4)


def test_chunks_hold_the_dump_tokens_masks_and_logprobs(run):
    records = dump_records(run)
    packed = pack(records)
    assert len(packed.chunks) == -(-len(records) // CHUNK)
    for c, data in enumerate(packed.chunks):
        head, a = decode_chunk(data)
        for k, body in enumerate(head["items"]):
            r = records[c * CHUNK + k]
            t0, n, s0, m = body["tok"]
            mask = np.array(r["loss_mask"])
            sampled = mask == 1
            assert a["ids"][t0 : t0 + n].tolist() == r["token_ids"]
            assert a["mask"][t0 : t0 + n].tolist() == r["loss_mask"]
            assert m == sampled.sum()
            lp = np.array(r["logprobs"], dtype=np.float32)[sampled]
            assert np.array_equal(a["lp"][s0 : s0 + m], lp)
            trainer = np.array(r["metadata"]["trainer_logprobs"], dtype=np.float32)[sampled]
            assert np.array_equal(a["tlp"][s0 : s0 + m], trainer)
            assert a["ver"][s0 : s0 + m].tolist() == np.array(r["token_versions"])[sampled].tolist()
            assert body["messages"] == r["messages"] and body["task_id"] == r["task_id"]
            assert "trainer_logprobs" not in body["metadata"] and "token_ids" not in body


def test_index_rows_follow_the_dump(run):
    records = dump_records(run)
    idx = pack(records).index
    assert idx["step"] == [r["step"] for r in records]
    assert idx["task"] == [r["task_id"] for r in records]
    assert idx["reward"] == [r["reward"] for r in records]
    assert [idx["statuses"][s] for s in idx["status"]] == [r["status"] for r in records]
    assert idx["nresp"] == [sum(r["loss_mask"]) for r in records]
    assert [idx["envs"][e] for e in idx["env"]] == [r["metadata"]["env_id"] for r in records]
    r = records[0]
    gaps = [
        abs(t - lp)
        for t, lp, m in zip(
            r["metadata"]["trainer_logprobs"], r["logprobs"], r["loss_mask"], strict=True
        )
        if m
    ]
    assert idx["mismatch"][0] == pytest.approx(max(gaps), abs=1e-6)


def test_a_run_still_writing_its_last_line_opens(run, tmp_path):
    live = tmp_path / "live.jsonl"
    lines = (run / "trajectories" / "step_000001.jsonl").read_text().splitlines()
    live.write_text("\n".join(lines[:3]) + "\n" + lines[3][:50])
    source = open_run(live)
    assert source.kind == "rollout" and len(list(source.records())) == 3


def test_inputs_that_are_no_run_get_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        open_run(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"not a vime train dir .* nor a vime eval dir"):
        open_run(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n")
    with pytest.raises(ConfigError, match=r"bad\.jsonl:1: expected a JSON object"):
        list(open_run(bad).records())


def test_run_text_cannot_close_the_data_blocks(tmp_path):
    rows = [
        {
            "task_id": "</script><script>alert(1)</script>",
            "sample_index": 0,
            "reward": 1.0,
            "messages": [{"role": "assistant", "content": HOSTILE + "<!-- </script>"}],
        }
    ]
    src = tmp_path / "r.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_view(src).read_text()
    scripts = re.findall(r"<script[^>]*>", page)
    # The meta and token blocks, the viewer script, one chunk: nothing from the run.
    assert scripts == [
        '<script type="application/json" id="vime-meta">',
        '<script type="application/json" id="vime-pieces">',
        "<script>",
        '<script type="application/octet-stream" id="c0">',
    ]
    assert "alert(1)" in page and "<script>alert" not in page
    assert "\\u003cimg src=x onerror" in page  # the preview in the index: data, escaped


def test_the_content_security_policy_allows_only_the_viewer_script(run):
    import base64
    import hashlib

    page = write_view(run).read_text()
    policy = re.search(r'Content-Security-Policy" content="([^"]+)"', page)[1]
    script = re.search(r"<script>(.*?)</script>", page, re.S)[1]
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in policy and "default-src 'none'" in policy


def test_eval_dirs_show_pass_at_k_and_task_rows(tmp_path):
    from vime.eval.report import summarize, write_reports

    rows = [
        {"task_id": f"t{i}", "sample_index": s, "reward": float(s < i), "correct": s < i,
         "answer": str(s), "error": "timeout: slow" if (i, s) == (0, 0) else None,
         "response": f"reply {i}/{s}"}
        for i in range(3)
        for s in range(2)
    ]  # fmt: skip
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = [{"id": f"t{i}"} for i in range(3)]
    summary = summarize(tasks, {(r["task_id"], r["sample_index"]): r for r in rows}, n=2, ks=[1, 2])
    identity = {"env": "vime/Math-v0", "model": "m", "n": 2, "temperature": 1.0, "max_tokens": 8}
    write_reports(tmp_path, summary, identity)
    source, packed, _ = build(tmp_path)
    assert source.kind == "eval" and packed.count == 6
    assert [packed.index["statuses"][s] for s in packed.index["status"]][:2] == [
        "failed",
        "completed",
    ]
    assert packed.index["preview"][1] == "reply 0/1"
    page = write_view(tmp_path).read_text()
    assert 'aria-label="pass@k"' in page and page.count('class="task-link"') == 3


def test_train_dirs_chart_every_recorded_metric_group(run):
    page = write_view(run).read_text()
    for title in ("reward", "grad norm", "time per phase", "eval points (held-out)", "KL"):
        assert f'aria-label="{title}"' in page
    assert "rollout vs trainer logprob mismatch" in page


def test_vime_view_writes_the_page_from_the_command_line(run, tmp_path, capsys):
    out = tmp_path / "v.html"
    assert main(["view", str(run), "--output", str(out)]) == 0
    assert "60 episodes" in capsys.readouterr().err and out.stat().st_size > 10_000
    assert main(["view", str(run), "--serve", "--output", str(out)]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_served_page_fetches_chunks_by_number(run):
    source, packed, pieces = build(run)
    server = make_server(source, packed, pieces, host="127.0.0.1", port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        page = urllib.request.urlopen(base + "/").read().decode()
        assert '"chunk_url":"chunk/"' in page and 'id="c0"' not in page
        assert urllib.request.urlopen(base + "/chunk/1").read() == packed.chunks[1]
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(base + f"/chunk/{len(packed.chunks)}")
    finally:
        server.shutdown()
        server.server_close()


def test_vime_view_serve_answers_until_stopped(run):
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "vime", "view", str(run), "--serve", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        url = re.search(r"at (http://\S+/) ", line)[1]
        assert "60 episodes" in line
        assert b"vime-meta" in urllib.request.urlopen(url, timeout=10).read()
    finally:
        proc.terminate()
        proc.wait(10)
