"""`vime train` survives a kill -9 and runs across a two-node Ray cluster."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter

import pytest

pytestmark = pytest.mark.slow


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.extended  # CI covers the same resume through tests/faults' driver SIGKILL case
def test_kill_9_mid_step_then_resume_never_trains_a_sample_twice(
    tiny_model, task_file, tmp_path, vime_train
):
    out = tmp_path / "run"
    argv = vime_train.argv(tiny_model, task_file, out, "--num-steps", "4", "--save-interval", "1")
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=vime_train.env(), start_new_session=True
    )
    try:
        latest = out / "checkpoints" / "latest"
        wait_for(
            lambda: latest.exists() and latest.read_text() == "step_000001", 900, "checkpoint 1"
        )
        # Mid-step: step 2's samples are trained (or being trained) but not checkpointed.
        samples = out / "trained_samples.jsonl"
        wait_for(
            lambda: samples.exists() and len(samples.read_text().splitlines()) > 4,
            600,
            "step 2 training",
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(2)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what a machine crash would take with it
        except ProcessLookupError:
            pass
    assert latest.read_text() in ("step_000001", "step_000002")
    vime_train.run(vime_train.argv(tiny_model, task_file, out, "--num-steps", "3", "--resume"))
    rows = vime_train.read_jsonl(out / "metrics.jsonl")
    assert rows[-1]["step"] == 3
    trained = [r["sample_id"] for r in vime_train.read_jsonl(out / "trained_samples.jsonl")]
    assert len(trained) == 12  # three steps of 2 tasks x 2 samples, one lineage
    assert [s for s, c in Counter(trained).items() if c > 1] == []
    assert sorted({r["step"] for r in vime_train.read_jsonl(out / "trained_samples.jsonl")}) == [
        0,
        1,
        2,
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def two_node_cluster(tmp_path, vime_train):
    env = vime_train.env()
    port = _free_port()
    ray = [os.path.join(os.path.dirname(sys.executable), "ray")]
    head = [*ray, "start", "--head", f"--port={port}", "--num-cpus=1", '--resources={"trainer_node": 1}',
            "--include-dashboard=false", "--disable-usage-stats"]  # fmt: skip
    worker = [
        *ray,
        "start",
        f"--address=127.0.0.1:{port}",
        "--num-cpus=1",
        '--resources={"engine_node": 1}',
    ]
    subprocess.run(head, check=True, env=env, capture_output=True, timeout=300)
    try:
        subprocess.run(worker, check=True, env=env, capture_output=True, timeout=300)
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([*ray, "stop", "--force"], env=env, capture_output=True, timeout=300)


def test_trainer_and_engines_on_different_nodes(
    tiny_model, task_file, tmp_path, vime_train, two_node_cluster
):
    out = tmp_path / "run"
    extra = ("--num-steps", "2", "--ray-address", two_node_cluster,
             "--trainer-resource", "trainer_node", "--engine-resource", "engine_node")  # fmt: skip
    result = vime_train.run(vime_train.argv(tiny_model, task_file, out, *extra))
    line = next(x for x in result.stdout.splitlines() if x.startswith("trainer rank 0 on node"))
    trainer_node, engine_node = line.split(" on node ")[1].split(",")[0], line.rsplit(" ", 1)[1]
    assert trainer_node != engine_node
    rows = vime_train.read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["sync/cross_node"] == 1.0 for r in rows)  # weights went through Ray's object store
