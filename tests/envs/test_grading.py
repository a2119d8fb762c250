"""Grading never blocks the rollout process: graders run in killable worker processes with a
hard time limit, off the event loop, and the workers never outlive their process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import vime
from vime.envs.grading import GraderPool, GraderTimeout, grader_pool, heavy, run_graded

# 9^(9^9) has about 370 million digits: math-verify would compute it for minutes, holding the GIL.
HUGE = "\\boxed{9^{9^{9}}}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def slow_square(x: int, seconds: float) -> int:
    """A grader that takes ``seconds`` (module level, so a worker can import it)."""
    time.sleep(seconds)
    return x * x


def worker_pid() -> int:
    return os.getpid()


def test_a_graded_call_runs_in_a_worker_process_and_returns_its_result():
    assert run_graded(slow_square, 7, 0.0, timeout=30) == 49
    assert run_graded(worker_pid, timeout=30) in grader_pool().pids
    assert run_graded(worker_pid, timeout=30) != os.getpid()


def test_an_exception_of_the_grader_is_raised_to_the_caller():
    with pytest.raises(ZeroDivisionError) as caught:
        run_graded(divmod, 1, 0, timeout=30)
    assert "in the grading worker" in "".join(caught.value.__notes__)


def test_a_call_past_its_limit_is_killed_counted_and_its_worker_replaced():
    pool = GraderPool(1)
    try:
        (before,) = [pool.call(worker_pid, timeout=30)]
        started = time.monotonic()
        with pytest.raises(GraderTimeout, match=r"past its 0\.5 s limit"):
            pool.call(pow, 9, 9**9, timeout=0.5)  # big-int power: holds the GIL until done
        assert time.monotonic() - started < 3
        assert pool.timeouts == 1
        assert not _alive(before)  # killed and reaped, not a zombie
        after = pool.call(worker_pid, timeout=60)  # waits for the replacement to warm up
        assert after != before and pool.pids == [after]
    finally:
        pool.shutdown()


def test_shutdown_kills_every_worker():
    pool = GraderPool(2)
    pool.call(worker_pid, timeout=60)
    pids = pool.pids
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    pool.shutdown()
    assert _wait_gone(pids, 5) == []


def test_workers_die_with_their_process_even_mid_computation():
    script = textwrap.dedent(
        """
        import os, sys, threading
        from vime.envs.grading import GraderPool, GraderTimeout
        pool = GraderPool(2)
        print(pool.call(os.getpid, timeout=60), flush=True)
        threading.Thread(target=pool.call, args=(pow, 9, 9**9), kwargs={"timeout": 600}).start()
        import time; time.sleep(0.5)
        print(" ".join(map(str, pool.pids)), flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        parent.stdout.readline()
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    finally:
        parent.send_signal(signal.SIGKILL)  # no atexit, no cleanup: only the kernel is left
        parent.wait()
    assert _wait_gone(pids) == []


def test_a_grader_defined_in_main_is_refused_with_the_reason():
    def local():  # not importable by a worker
        return 1

    local.__module__ = "__main__"
    with pytest.raises(vime.errors.EnvError, match="defined in __main__"):
        run_graded(local, timeout=5)


class HeavyAnswerEnv(vime.ToolEnv):
    """Its answer() is heavy: evaluates the reply as an integer power, like a naive grader."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "What is 2 ** 10?"}], {}

    @heavy(timeout=1.0)
    def answer(self, message):
        base, exponent = (int(x) for x in message["content"].split("**"))
        correct = base**exponent == 1024
        return [], float(correct), True, False, {"correct": float(correct), "pid": os.getpid()}


def test_a_heavy_answer_runs_in_a_worker_and_scores_zero_past_its_limit():
    env = HeavyAnswerEnv()
    env.reset()
    _, reward, terminated, _, info = env.step("2 ** 10")
    assert (reward, terminated, info["correct"]) == (1.0, True, 1.0)
    assert info["pid"] != os.getpid()
    env.reset()
    started = time.monotonic()
    _, reward, terminated, _, info = env.step("9 ** 387420489")
    assert (reward, terminated, info["grader_timeout"]) == (0.0, True, 1.0)
    assert time.monotonic() - started < 5


async def _episodes_with_one_huge_answer(
    task_of_the_hostile_one: dict, n: int = 32
) -> tuple[list, float, float]:
    """Run n Math-v0 episodes concurrently (one answers HUGE); return their results, the longest
    event-loop stall and the wall time."""
    ok_task = {"id": "sum", "question": "What is 8 + 6?", "answer": "14"}
    envs = [vime.make("vime/Math-v0", grader_timeout=2.0) for _ in range(n)]
    stall = 0.0
    done = asyncio.Event()

    async def watch_the_loop() -> None:
        nonlocal stall
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.005)
            stall = max(stall, time.perf_counter() - before - 0.005)

    async def episode(i: int) -> tuple[float, dict, float]:
        task = task_of_the_hostile_one if i == 0 else ok_task
        await envs[i].areset(options={"task": task})
        _, reward, _, _, info = await envs[i].astep(HUGE if i == 0 else "\\boxed{14}")
        return reward, info, time.perf_counter() - started

    watcher = asyncio.create_task(watch_the_loop())
    started = time.perf_counter()
    results = await asyncio.gather(*(episode(i) for i in range(n)))
    wall = time.perf_counter() - started
    done.set()
    await watcher
    return results, stall, wall


@pytest.mark.parametrize("answer_type", ["value", "expression"])
async def test_one_huge_answer_neither_stalls_the_loop_nor_delays_other_episodes(answer_type):
    assert grader_pool().wait_warm(120)  # every worker started, as in a long run
    hostile = {"id": "pow", "question": "What is 9^9^9?", "answer": "1", "answer_type": answer_type}
    # Best of two runs: on a shared 2-core box the OS alone can deschedule the loop for 100 ms;
    # a grader holding the GIL (main before the fix: >60 s) fails both.
    for _ in range(2):
        assert grader_pool().wait_warm(120)
        results, stall, wall = await _episodes_with_one_huge_answer(hostile)
        print(f"\n[{answer_type}] max event-loop stall {stall * 1000:.1f} ms, wall {wall:.2f} s")
        if stall < 0.1 and max(t for _, _, t in results[1:]) < 1.5:
            break
    (reward, info, _), *others = results
    assert reward == 0.0
    if answer_type == "expression":  # no value rule to stop it: math-verify runs, is killed
        assert info["grader_timeout"] == 1.0
    else:  # 9^(9^9) is not a value: rejected without evaluating it
        assert (info["grader_timeout"], info["answer_rejected"]) == (0.0, "not_a_value")
    assert [r for r, _, _ in others] == [1.0] * 31
    assert max(t for _, _, t in others) < 1.5  # on time: not behind the 2 s grader limit
    assert stall < 0.1


RAY_SCRIPT = """
import json, os, time
import ray

ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)


@ray.remote
class Grader:
    def grade(self):
        import vime
        from vime.envs.grading import grader_pool

        env = vime.make("vime/Math-v0", grader_timeout=1.0)
        rewards = []
        for task, reply in [
            ({"id": "a", "question": "What is 8 + 6?", "answer": "14"}, "\\\\boxed{14}"),
            (
                {"id": "b", "question": "q", "answer": "1", "answer_type": "expression"},
                "\\\\boxed{9^{9^{9}}}",
            ),
        ]:
            env.reset(options={"task": task})
            _, reward, _, _, info = env.step(reply)
            rewards.append([reward, info["grader_timeout"]])
        return {"rewards": rewards, "actor": os.getpid(), "workers": grader_pool().pids}


actor = Grader.remote()
out = ray.get(actor.grade.remote(), timeout=300)
ray.kill(actor)
print(json.dumps(out), flush=True)
ray.shutdown()
"""


@pytest.mark.slow
def test_grading_works_in_a_ray_actor_and_its_workers_die_with_the_actor(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, "-c", RAY_SCRIPT],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["rewards"] == [[1.0, 0.0], [0.0, 1.0]]  # graded; the huge one killed at 1 s
    assert out["workers"] and out["actor"] not in out["workers"]
    assert _wait_gone(out["workers"]) == []  # the actor was killed: its workers went with it


def test_a_forked_child_gets_its_own_workers():
    parent_workers = set(grader_pool().pids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: grade, and report which worker did it
        try:
            os.write(write, str(run_graded(worker_pid, timeout=60)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child_worker = int(f.read() or 0)
    os.waitpid(pid, 0)
    assert child_worker and child_worker not in parent_workers
    assert run_graded(worker_pid, timeout=60) in grader_pool().pids  # the parent's still work
