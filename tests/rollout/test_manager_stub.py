"""The rollout manager against the stub engine: groups, limits, isolation of failures,
dynamic sampling, abort and partial rollout."""

from __future__ import annotations

import asyncio

import pytest

from vime.errors import ConfigError
from vime.inference.client import VimeClient
from vime.rollout import RolloutConfig, load_hook, nonzero_reward_variance
from vime.rollout.filters import no_failures
from vime.types import Status, Trajectory

SAMPLING = {"max_tokens": 100}
TASKS = [{"id": str(i), "question": f"Count {i}."} for i in range(3)]


async def test_groups_of_n_per_task(make_manager):
    batch = await make_manager(n=4).generate(TASKS, SAMPLING)

    assert [len(g) for g in batch.groups] == [4, 4, 4]
    assert sorted(g[0].task_id for g in batch.groups) == ["0", "1", "2"]
    for group in batch.groups:
        assert {t.task_id for t in group} == {group[0].task_id}
        assert [t.sample_index for t in group] == [0, 1, 2, 3]
        assert all(t.status is Status.COMPLETED and t.reward == 2.0 for t in group)
    assert batch.metrics["episodes"] == 12
    assert batch.metrics["turns"] == 36
    assert batch.metrics["status/completed"] == 12


async def test_global_concurrency_limit_holds(make_manager, stub):
    stub.delay = 0.02
    await make_manager(n=4, max_concurrency=3).generate(TASKS, SAMPLING)
    assert stub.max_in_flight == 3


async def test_per_env_concurrency_limit_holds(make_manager, stub):
    stub.delay = 0.02
    await make_manager(n=4, max_concurrency=64, env_concurrency=2).generate(TASKS, SAMPLING)
    assert stub.max_in_flight == 2


async def test_stuck_env_costs_only_its_own_trajectory(make_manager):
    tasks = [*TASKS, {"id": "9", "fault": "stuck_reset"}]
    batch = await make_manager(n=2, episode_timeout=1.0).generate(tasks, SAMPLING)

    by_task = {g[0].task_id: g for g in batch.groups}
    assert [t.status for t in by_task["9"]] == [Status.FAILED, Status.FAILED]
    assert by_task["9"][0].error == "episode timed out after 1.0s"
    assert all(t.status is Status.COMPLETED for tid in "012" for t in by_task[tid])
    assert batch.metrics["status/failed"] == 2


async def test_hanging_tool_becomes_an_error_observation(make_manager):
    tasks = [*TASKS, {"id": "9", "fault": "hang_tool"}]
    batch = await make_manager(n=1, episode_timeout=20.0).generate(tasks, SAMPLING)

    hung = next(g[0] for g in batch.groups if g[0].task_id == "9")
    assert hung.status is Status.COMPLETED
    assert hung.metrics["tool_errors"] == 2
    assert hung.messages[2]["content"] == "Error: tool 'add' timed out after 0.3 s"
    assert all(g[0].reward == 2.0 for g in batch.groups if g[0].task_id != "9")


async def test_crashing_env_step_fails_with_the_reason(make_manager):
    tasks = [*TASKS, {"id": "9", "fault": "crash_step"}]
    batch = await make_manager(n=1).generate(tasks, SAMPLING)

    crashed = next(g[0] for g in batch.groups if g[0].task_id == "9")
    assert crashed.status is Status.FAILED
    assert crashed.error == "RuntimeError: the grader crashed"
    assert crashed.num_response_tokens > 0  # what was sampled before the crash is kept
    assert batch.metrics["failed/RuntimeError"] == 1


async def test_dead_engine_costs_only_the_episodes_that_use_it(make_manager, client):
    dead = VimeClient("http://127.0.0.1:9/v1", model="stub", timeout=2.0, max_retries=0)
    calls = iter(range(100))
    batch = await make_manager(lambda: dead if next(calls) == 0 else client, n=2).generate(
        TASKS, SAMPLING
    )
    await dead.close()

    statuses = sorted(str(t.status) for t in batch.trajectories)
    assert statuses == ["completed"] * 5 + ["failed"]
    failed = next(t for t in batch.trajectories if t.status is Status.FAILED)
    assert failed.error.startswith("InferenceError: cannot connect to the inference server")


def odd_task_ids(group) -> bool:
    """Keep groups whose task id is odd."""
    return int(group[0].task_id) % 2 == 1


async def test_dynamic_sampling_oversamples_until_enough_groups_pass(make_manager):
    tasks = [{"id": str(i)} for i in range(8)]
    manager = make_manager(n=2, over_sampling=3.0, group_filter=odd_task_ids, max_concurrency=2)
    batch = await manager.generate(tasks, SAMPLING, num_groups=2)

    assert [g[0].task_id for g in batch.groups] == ["1", "3"]
    assert [g[0].task_id for g in batch.dropped] == ["0", "2"]
    assert batch.metrics["groups_kept"] == 2
    assert batch.metrics["groups_launched"] <= 6


async def test_groups_cancelled_while_their_envs_close_do_not_break_the_batch(
    make_manager, faulty_env_class
):
    # Once the batch is full the manager cancels the groups still running; an episode that
    # is already closing its env must end quietly, not fail the whole generate() call.
    class SlowClose(faulty_env_class):
        def close(self):
            import time

            time.sleep(0.3)
            super().close()

    tasks = [{"id": str(i), "question": f"Count {i}."} for i in range(6)]
    manager = make_manager(n=1, over_sampling=6.0, env_class=SlowClose)
    batch = await manager.generate(tasks, SAMPLING, num_groups=1)

    assert len(batch.groups) == 1 and batch.groups[0][0].status is Status.COMPLETED
    assert batch.metrics["groups_launched"] == 6


async def test_abort_returns_running_episodes_as_aborted(make_manager, stub):
    stub.delay = 0.2
    manager = make_manager(n=2)
    running = asyncio.ensure_future(manager.generate(TASKS, SAMPLING))
    # Abort once every episode is mid-request (a fixed sleep raced a loaded machine).
    async with asyncio.timeout(10):
        while stub.in_flight < 6:
            await asyncio.sleep(0.01)
    manager.abort()
    batch = await asyncio.wait_for(running, 5)

    assert batch.groups == []
    assert batch.metrics["status/aborted"] == 6
    assert all(t.error == "aborted" for g in batch.dropped for t in g)


async def test_partial_rollout_carries_unfinished_groups_across_a_weight_update(make_manager, stub):
    stub.delay = lambda prompt: 0.15 if "SLOW" in prompt else 0.0
    manager = make_manager(n=1, partial_rollout=True, over_sampling=2.0)
    tasks = [{"id": "0", "question": "fast"}, {"id": "1", "question": "SLOW"}]
    first = await manager.generate(tasks, SAMPLING, num_groups=1)
    stub.weight_version = 1  # the trainer published new weights
    second = await manager.generate([], SAMPLING, num_groups=1)

    assert [g[0].task_id for g in first.groups] == ["0"]
    assert first.metrics["groups_carried_over"] == 1
    carried = second.groups[0][0]
    assert carried.task_id == "1" and carried.status is Status.COMPLETED
    assert carried.metadata["carried_over"] is True
    assert carried.weight_versions[0] == 0 and carried.weight_versions[-1] == 1
    assert {v for v, m in zip(carried.token_versions, carried.loss_mask, strict=True) if m} == {
        0,
        1,
    }


def test_nonzero_reward_variance_keeps_only_groups_with_signal():
    def group(*rewards):
        return [Trajectory([1], [0], [0.0], 1, reward=r) for r in rewards]

    assert nonzero_reward_variance(group(0.0, 1.0))
    assert not nonzero_reward_variance(group(1.0, 1.0))
    assert not nonzero_reward_variance(group(1.0))


def test_hooks_load_by_name_or_dotted_path():
    assert load_hook("nonzero_reward_variance") is nonzero_reward_variance
    assert load_hook("vime.rollout.filters:nonzero_reward_variance") is nonzero_reward_variance
    assert load_hook("vime.rollout.filters.no_failures") is no_failures
    assert load_hook(odd_task_ids) is odd_task_ids


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope", "neither a built-in"),
        ("vime.rollout.filters:missing", "cannot load hook"),
        ("vime.rollout.filters:BUILTIN", "not a callable"),
    ],
)
def test_bad_hooks_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        load_hook(spec)


@pytest.mark.parametrize(
    "options, flag",
    [
        ({"n": 0}, "--n"),
        ({"max_concurrency": 0}, "--max-concurrency"),
        ({"over_sampling": 0.5}, "--over-sampling"),
    ],
)
def test_bad_rollout_config_names_the_flag(options, flag):
    with pytest.raises(ConfigError, match=flag):
        RolloutConfig(env_id="x", **options)
