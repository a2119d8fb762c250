"""bench/sandbox_latency.py runs end to end and reports every backend and level it was given."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vime.sandboxes import bwrap

BENCH = Path(__file__).resolve().parents[2] / "bench" / "sandbox_latency.py"


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
def test_the_latency_benchmark_writes_a_row_per_backend_and_level(tmp_path):
    out = tmp_path / "latency.json"
    args = ["--runs", "4", "--rounds", "2", "--concurrency", "1", "2"]
    proc = subprocess.run(
        [sys.executable, str(BENCH), *args, "--backends", "bare,local", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    rows = [(r["backend"], r["concurrency"], r["runs"], r["failures"]) for r in report["results"]]
    assert rows == [("bare", 1, 4, 0), ("bare", 2, 4, 0), ("local", 1, 4, 0), ("local", 2, 4, 0)]
    assert all(r["p99_ms"] >= r["p50_ms"] > 0 for r in report["results"])
    assert report["targets"]["local_p50_vs_bare_max"] == 1.6
    assert "| local | 1 |" in proc.stdout
    assert "local p50 / bare p50 at concurrency 1:" in proc.stdout
    assert report["local_launcher"] == (bwrap.find_launcher() or "setpriv+prlimit")
    assert len(report["machine"]["load_at_start"]) == 3
