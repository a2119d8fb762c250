"""bench/rollout_overhead.py runs end to end at a small size and reports every point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench" / "rollout_overhead.py"


def test_overhead_bench_plays_every_episode_correctly(tmp_path):
    out = tmp_path / "overhead.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--concurrency", "8", "--episodes", "8", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["framework"], r["concurrency"]) for r in rows] == [
        ("vime (tokens)", 8),
        ("vime (chat)", 8),
    ]
    for row in rows:
        assert row["episodes"] == row["correct_episodes"] == 8
        assert row["turns"] == 40  # 4 tool calls and the answer per episode
        assert row["drift"] == 0
        assert row["turns_per_s"] > 0
    assert "turns/s" in proc.stdout
