"""End to end: `vime train` with a tiny model, real vLLM engine, router, Ray and trainer."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

METRIC_KEYS = {
    "rollout/reward_mean", "rollout/reward_std", "rollout/response_len_mean",
    "rollout/tool_error_rate", "rollout/drift_count", "train/loss", "train/grad_norm",
    "mismatch/abs_diff_mean", "time/rollout_s", "time/train_s", "time/sync_s", "weight_version",
}  # fmt: skip


def sampled_versions(dump: Path) -> set[int]:
    versions: set[int] = set()
    for row in map(json.loads, dump.read_text().splitlines()):
        versions |= {v for v, m in zip(row["token_versions"], row["loss_mask"], strict=True) if m}
    return versions


def test_sync_run_trains_syncs_exports_and_resumes(tiny_model, task_file, tmp_path, vime_train):
    out = tmp_path / "run"
    argv = vime_train.argv(tiny_model, task_file, out, "--num-steps", "2", "--save-interval", "1")
    result = vime_train.run(argv)
    assert "reward:" in result.stdout and "TensorBoard logs:" in result.stdout

    # Engines serve the new weights after each sync: step k's tokens come from version k-1.
    assert sampled_versions(out / "trajectories" / "step_000001.jsonl") == {0}
    assert sampled_versions(out / "trajectories" / "step_000002.jsonl") == {1}
    rows = vime_train.read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert set(rows[-1]) >= METRIC_KEYS, METRIC_KEYS - set(rows[-1])
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))

    # The exported HF folder loads in transformers and its weights moved.
    import torch
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(out / "exports" / "step_000002").state_dict()
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # A resume continues at the next step, from the checkpointed data position.
    assert (out / "checkpoints" / "latest").read_text() == "step_000002"
    vime_train.run(vime_train.argv(tiny_model, task_file, out, "--num-steps", "3", "--resume"))
    rows = vime_train.read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert sampled_versions(out / "trajectories" / "step_000003.jsonl") == {2}
    trained = [r["sample_id"] for r in vime_train.read_jsonl(out / "trained_samples.jsonl")]
    assert len(trained) == 12
    assert [s for s, c in Counter(trained).items() if c > 1] == []


def test_an_output_dir_with_a_run_needs_resume(tiny_model, task_file, tmp_path, vime_train):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "latest").write_text("step_000001")
    argv = vime_train.argv(tiny_model, task_file, out, "--num-steps", "1")
    result = subprocess.run(argv, capture_output=True, text=True, env=vime_train.env(), timeout=300)
    assert result.returncode == 2
    assert "already holds a run; pass --resume" in result.stderr


def test_async_run_overlaps_rollouts_and_bounds_staleness(
    tiny_model, task_file, tmp_path, vime_train
):
    out = tmp_path / "async"
    extra = ("--num-steps", "3", "--mode", "async", "--max-staleness", "1")
    vime_train.run(vime_train.argv(tiny_model, task_file, out, *extra))
    rows = vime_train.read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["weight_version"] == 3.0
    for step in (1, 2, 3):
        # Step k trains at version k-1 on tokens sampled at most one version earlier.
        versions = sampled_versions(out / "trajectories" / f"step_{step:06d}.jsonl")
        assert versions and min(versions) >= step - 2, (step, versions)
    assert any(sampled_versions(out / "trajectories" / f"step_{s:06d}.jsonl") - {0} for s in (2, 3))
