"""One case of each fault of bench/faults.py against a real `vime train` (tiny model, CPU).

CI runs the seven cases not marked ``extended`` (``-m "faults and not extended"``), about two
minutes each on a 2-core box; the other six run with ``pytest -m extended``.

Every case asserts the same zeros: no episode lost without a reason, no step trained twice,
no process left behind, and the run finished (after a ``--resume`` where it had to stop).
"""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(900)]


def check_zeros(o) -> None:
    assert o.finished, f"the run did not finish: {o.message or '(no message)'}; {o}"
    assert o.lost_silently == 0, o
    assert o.steps_twice == 0, o
    assert o.leftovers == 0 and o.extra.get("leftovers_after_stop", 0) == 0, o
    assert o.steps_lost <= o.since_checkpoint, o


def test_a_killed_trainer_stops_the_run_with_one_error_and_a_resume_hint(faults, tmp_path):
    o = faults.run_fault("trainer actor killed", tmp_path)
    assert o.extra["first_rc"] == 2  # a VimeError, not a traceback or a hang
    assert o.message.startswith("vime: error: the run stopped: an actor died during the trainer's")
    assert "Rerun the same command with --resume" in o.message
    assert o.extra["stopped_s"] < 120
    check_zeros(o)


def test_a_corrupted_newest_checkpoint_resumes_from_the_one_before(faults, tmp_path):
    o = faults.run_fault("newest checkpoint corrupted", tmp_path, seed=1)
    assert "the newest checkpoint is unusable: step_000002" in o.message
    assert "resuming from step_000001" in o.message
    check_zeros(o)


@pytest.mark.extended
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (needs root)")
def test_a_full_disk_fails_the_save_and_keeps_the_previous_checkpoint(faults, tmp_path):
    o = faults.run_fault("disk full during checkpoint", tmp_path)
    assert o.extra["first_rc"] == 2
    assert "could not save the checkpoint" in o.message and "the disk is full" in o.message
    assert "the previous checkpoint step_000002 is intact" in o.message
    assert o.extra["previous_intact"]
    check_zeros(o)


def test_a_driver_killed_while_writing_a_checkpoint_resumes_without_training_twice(
    faults, tmp_path
):
    o = faults.run_fault("driver SIGKILL during checkpoint", tmp_path)
    assert o.extra["leftovers_after_kill"] == 0, o
    check_zeros(o)


@pytest.mark.parametrize("mode", ["sync", pytest.param("async", marks=pytest.mark.extended)])
def test_the_run_survives_an_engine_killed_mid_rollout(faults, tmp_path, mode):
    # In async mode this once left the run idle for good: the batch rolled out while the
    # engine restarted failed every episode, and the driver never heard its producer died.
    o = faults.run_fault("engine kill -9", tmp_path, mode)
    check_zeros(o)
    assert o.extra["steps_at_fault"] < 6 and o.recover_s is not None, o  # 6 steps


def test_the_run_survives_the_router_killed_mid_rollout(faults, tmp_path):
    # The router's death drops every request in flight: CI once saw all of a step's episodes
    # fail and the run stop, before the client sent a dropped request again.
    o = faults.run_fault("router kill -9", tmp_path)
    check_zeros(o)
    assert o.extra["steps_at_fault"] < 6 and o.recover_s is not None, o  # 6 steps


@pytest.mark.extended
def test_the_run_survives_a_hung_engine(faults, tmp_path):
    check_zeros(faults.run_fault("engine SIGSTOP 90s", tmp_path))


@pytest.mark.docker
def test_the_run_survives_a_sandbox_container_killed_mid_tool_call(faults, tmp_path):
    check_zeros(faults.run_fault("docker sandbox killed mid-tool-call", tmp_path))


@pytest.mark.extended
@pytest.mark.parametrize("fault", ["env reset raises", "env step raises"])
def test_episodes_of_a_raising_env_fail_with_their_reason_and_the_rest_train(
    faults, tmp_path, fault
):
    o = faults.run_fault(fault, tmp_path)
    check_zeros(o)
    assert o.failed_with_reason > 0, o


def test_a_grader_past_its_limit_scores_zero_and_is_counted(faults, tmp_path):
    o = faults.run_fault("grader times out", tmp_path)
    check_zeros(o)
    assert o.extra["grader_timeouts"] > 0, o


@pytest.mark.extended
def test_the_run_survives_the_remote_sandbox_server_down_for_30s(faults, tmp_path):
    o = faults.run_fault("remote sandbox server down 30s", tmp_path)
    print(o)
    check_zeros(o)
