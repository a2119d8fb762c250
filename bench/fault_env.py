"""The env of the fault-injection runs (bench/faults.py): parity rewards, plus faults on cue.

A task's ``fault`` field makes a random ``FAULT_RATE`` of its episodes fail on purpose:
``reset`` or ``step`` raise, or the grader (run in a killable grading worker) sleeps past its
time limit. Other episodes earn reward 1 when the sum of the reply's character codes is even,
so a random tiny model has signal. With ``sandbox=`` every step first makes a two-second tool
call in a fresh sandbox of that backend (the harness kills its container or its server meanwhile).
"""

from __future__ import annotations

import random
import threading
import time

import vime
from vime.envs.base import run_in_env_thread
from vime.envs.grading import GraderTimeout, run_graded
from vime.sandboxes import create

GRADER_LIMIT_S = 1.0
# Per episode, so that most steps have some faulty episodes. A step whose every episode fails
# stops the run as a broken setup, and a free draw did that in 0.3^4 of the harness's 4-episode
# steps (CI hit it once): no more than MAX_IN_A_ROW episodes in a row take the fault, so any 4
# episodes reset one after another (a sync step's) hold a clean one.
FAULT_RATE = 0.3
MAX_IN_A_ROW = 2
_draw = random.SystemRandom()
_in_a_row = [0]
_lock = threading.Lock()


def draw_fault(fault: str | None) -> str | None:
    """``fault`` for a random ``FAULT_RATE`` of the episodes, never ``MAX_IN_A_ROW + 1`` in a
    row (None otherwise)."""
    with _lock:
        hit = fault is not None and _in_a_row[0] < MAX_IN_A_ROW and _draw.random() < FAULT_RATE
        _in_a_row[0] = _in_a_row[0] + 1 if hit else 0
    return fault if hit else None


def grade(text: str, sleep_s: float) -> float:
    """The parity grade, after ``sleep_s`` seconds (a grader stuck on a hostile answer)."""
    time.sleep(sleep_s)
    return float(sum(map(ord, text)) % 2 == 0)


class FaultyParity(vime.Env):
    """Parity rewards; ``task["fault"]`` in {reset, step, grader} injects that fault."""

    def __init__(self, sandbox: str | None = None, **sandbox_options) -> None:
        super().__init__()
        self.sandbox, self.sandbox_options = sandbox, sandbox_options

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.task = (options or {}).get("task") or {"question": "Say something."}
        self.fault = draw_fault(self.task.get("fault"))
        if self.fault == "reset":
            raise RuntimeError(f"injected fault in reset of task {self.task.get('id')}")
        return [{"role": "user", "content": self.task["question"]}], {}

    async def astep(self, action):
        if self.sandbox:
            async with create(self.sandbox, **self.sandbox_options) as box:
                result = await box.run("sleep 2; echo tool-ok", timeout=60)
            if result.exit_code != 0 or "tool-ok" not in result.stdout:
                raise RuntimeError(
                    f"the tool call failed: exit {result.exit_code}, {result.stderr[-200:]!r}"
                )
        return await run_in_env_thread(self.step, action)

    def step(self, action):
        fault = self.fault
        if fault == "step":
            raise RuntimeError(f"injected fault in step of task {self.task.get('id')}")
        text = self.parse_action(action).get("content") or ""
        sleep_s = 30.0 if fault == "grader" else 0.0
        try:
            reward = run_graded(grade, text, sleep_s, timeout=GRADER_LIMIT_S)
        except GraderTimeout:
            return [], 0.0, True, False, {"correct": 0.0, "grader_timeout": 1.0}
        return [], reward, True, False, {"correct": reward}


vime.register("bench/FaultyParity-v0", FaultyParity)
