"""bench/train_mfu.py --reference: the reference loop's rows join the run's table (its own
process, its JSON), a failing reference is a failed row with its error, and a run whose
workload differs from the reference's is refused before any measurement."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "hf_train_baseline.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_reference_rows_come_from_the_scripts_json(train_mfu, tmp_path):
    script = _script(
        tmp_path,
        """
        import json, os
        print("qwen3-1.7b plain transformers+SDPA 20000 tok/s")
        result = {"qwen3-1.7b": {"params_b": 1.72, "tokens_per_s": 20000.0, "peak_gb": 34.3}}
        json.dump(result, open(os.path.join(os.environ["OUT"], "hf_train_baseline.json"), "w"))
        """,
    )
    rows = train_mfu.reference_rows(str(script), ["qwen3-1.7b", "qwen3-4b"], rate=800.0)
    assert len(rows) == 1  # qwen3-4b: the script did not measure it
    row = rows[0]
    assert (row["model"], row["backend"], row["variant"]) == (
        "qwen3-1.7b",
        "reference",
        "reference",
    )
    assert (row["tokens_per_s"], row["peak_gb"]) == (20000.0, 34.3)
    # 6 N + 6 L s q for Qwen3-1.7B at 4,096 tokens (tied embeddings once as the output layer)
    h, q, kv, ffn, layers, vocab = 2048, 16 * 128, 8 * 128, 6144, 28, 151936
    n = layers * (h * (q + 2 * kv) + q * h + 3 * h * ffn) + vocab * h
    expected = (6 * n + 6 * layers * 4096 * q) * 20000.0 / 1e12
    assert row["tflops"] == pytest.approx(expected, rel=1e-12)
    assert row["mfu_measured"] == pytest.approx(expected / 800.0, rel=1e-12)


def test_a_failing_reference_is_a_failed_row_with_its_error(train_mfu, tmp_path):
    script = _script(tmp_path, "raise SystemExit('no CUDA GPU here')\n")
    rows = train_mfu.reference_rows(str(script), ["qwen3-1.7b"], rate=800.0)
    assert rows == [
        {"model": "qwen3-1.7b", "backend": "reference", "variant": "reference",
         "error": "no CUDA GPU here\n"}
    ]  # fmt: skip
    with pytest.raises(SystemExit, match="no such file"):
        train_mfu.reference_rows(str(tmp_path / "missing.py"), ["qwen3-1.7b"], rate=800.0)


def test_a_different_workload_is_refused_before_measuring(train_mfu, tmp_path, monkeypatch):
    script = _script(tmp_path, "raise AssertionError('must not run')\n")
    argv = ["train_mfu.py", "--reference", str(script), "--seq-len", "512", "--samples", "16"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(train_mfu, "matmul_tflops", lambda: pytest.fail("measured anyway"))
    with pytest.raises(SystemExit, match=r"16 of 512 .* --seq-len 4096 --samples 2"):
        train_mfu.main()
