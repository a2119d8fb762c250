"""``vime/Math-v0``: single-turn math graded with math-verify (boxed answers, equivalent forms)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from vime.data import load_tasks, validate_task
from vime.envs.arithmetic import DIFFICULTIES, arithmetic_task
from vime.envs.base import Env
from vime.envs.grading import GraderCrashed, GraderTimeout, grader_pool, run_graded
from vime.envs.math_grader import MathGrade, grade
from vime.errors import EnvError
from vime.types import Message

log = logging.getLogger(__name__)

SYSTEM_PROMPT = "Solve the problem. Put your final answer in \\boxed{}."
ANSWER_TYPES = ("value", "expression")


def grade_reply(text: str, task: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    """Grade reply ``text`` to ``task`` in a grading worker (see :mod:`vime.envs.grading`);
    returns the info of the step: ``correct``, ``extracted_answer``, ``answer_key`` (what
    maj@k votes on), ``answer_rejected`` (why a found answer did not score) and
    ``grader_timeout`` (1.0 when grading ran past ``timeout`` seconds and scored 0)."""
    info: dict[str, Any] = {"grader_timeout": 0.0}
    try:
        result = run_graded(
            grade,
            text,
            str(task["answer"]),
            str(task["question"]),
            values_only=task.get("answer_type", "value") == "value",
            timeout=timeout,
        )
    except (GraderTimeout, GraderCrashed) as exc:
        log.warning("task %s: %s; the answer scores 0", task.get("id"), exc)
        info["grader_timeout" if isinstance(exc, GraderTimeout) else "grader_crashed"] = 1.0
        result = MathGrade(False, "", None, "grader_failed")
    return {
        "correct": float(result.correct),
        "extracted_answer": result.extracted,
        "answer_key": result.answer_key,
        "answer_rejected": result.rejected,
        **info,
    }


class MathEnv(Env):
    """Single-turn math: one question, one answer, reward 1.0 when math-verify finds it equal to
    the task's ``answer`` (the last ``\\boxed{}``, else the last number or expression), else 0.0.

    An answer that still needs evaluating (``6 + 8``) or that offers several values scores 0,
    unless the task row says ``"answer_type": "expression"`` (see docs/envs.md). Grading runs
    in a killable worker process; past ``grader_timeout`` seconds it scores 0 and
    ``info["grader_timeout"]`` is 1.0. The env has no tools and never parses tool calls.

    Tasks come from ``options["task"]`` (rows with ``id``, ``question``, ``answer``), else from
    ``tasks`` (a JSONL/Parquet path or a list of rows, drawn with the reset seed), else from a
    seeded arithmetic generator of the given ``difficulty`` (easy, medium, hard).
    """

    def __init__(
        self,
        *,
        tasks: str | Path | list[dict[str, Any]] | None = None,
        difficulty: str = "easy",
        system_prompt: str | None = SYSTEM_PROMPT,
        grader_timeout: float = 10.0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if grader_timeout <= 0:
            raise ValueError(f"grader_timeout must be > 0 seconds, got {grader_timeout!r}")
        if difficulty not in DIFFICULTIES:
            raise ValueError(
                f"unknown difficulty {difficulty!r}; choose one of {list(DIFFICULTIES)}"
            )
        if isinstance(tasks, str | Path):
            tasks = load_tasks(tasks, required=("question", "answer"))
        elif tasks is not None:
            tasks = [
                validate_task(t, ("question", "answer"), where=f"tasks[{i}]")
                for i, t in enumerate(tasks)
            ]
        self.tasks = tasks
        self.difficulty = difficulty
        self.system_prompt = system_prompt
        self.grader_timeout = grader_timeout
        self.task: dict[str, Any] | None = None
        grader_pool()  # start the grading workers now, so the first answer finds them warm

    def generate_tasks(self, count: int, *, seed: int) -> list[dict[str, Any]]:
        """``count`` tasks for a training or evaluation run: the env's own task rows, else
        arithmetic problems drawn from ``seed`` (ids made unique by their draw index)."""
        if self.tasks:
            return list(self.tasks)
        import numpy as np

        rng = np.random.default_rng(seed)
        tasks = [arithmetic_task(rng, self.difficulty) for _ in range(count)]
        return [{**t, "id": f"{t['id']}#{i}"} for i, t in enumerate(tasks)]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Pose one question; ``info["task_id"]`` says which."""
        super().reset(seed=seed)
        if options and options.get("task") is not None:
            self.task = validate_task(options["task"], ("question", "answer"))
        elif self.tasks:
            self.task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        else:
            self.task = arithmetic_task(self.np_random, self.difficulty)
        if self.task.get("answer_type", "value") not in ANSWER_TYPES:
            raise EnvError(
                f"task {self.task['id']!r}: answer_type must be one of {list(ANSWER_TYPES)}, "
                f"got {self.task['answer_type']!r}"
            )
        messages = [{"role": "user", "content": str(self.task["question"])}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages, {"task_id": self.task["id"]}

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict]:
        """Grade the answer; the episode always terminates."""
        if self.task is None:
            raise EnvError("call reset() before step()")
        content = self.parse_action(action).get("content") or ""
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
        info = {**grade_reply(text, self.task, timeout=self.grader_timeout)}
        info["task_id"] = self.task["id"]
        return [], info["correct"], True, False, info
