"""``vime/Math-v0``: single-turn math graded with math-verify (boxed answers, equivalent forms)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from vime.envs.arithmetic import DIFFICULTIES, arithmetic_task
from vime.envs.base import Env

from vime.data import load_tasks, validate_task
from vime.errors import EnvError
from vime.types import Message

SYSTEM_PROMPT = "Solve the problem. Put your final answer in \\boxed{}."
# math-verify's own timeouts use SIGALRM, which fails outside the main thread (envs run in a
# thread pool), so we turn them off and bound the work by grading only the tail of a reply.
MAX_GRADED_CHARS = 4000


def grade(response: str, gold: str, question: str | None = None) -> tuple[bool, str]:
    """Whether ``response``'s final answer equals ``gold`` (math-verify), and that answer.

    With ``question``, an answer that only restates one of the question's expressions
    ("1 + 6" for "What is 1 + 6?") is wrong: math-verify would evaluate it to the gold value,
    and a policy learns to echo the question instead of solving it.
    """
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # the "timeout disabled" notice
    gold_text = gold if "$" in gold or "\\boxed" in gold else f"${gold}$"
    gold_parsed = parse(gold_text, parsing_timeout=None)
    predicted = parse(response[-MAX_GRADED_CHARS:], parsing_timeout=None)
    extracted = str(predicted[-1]) if predicted else ""
    if not gold_parsed or not predicted:
        return False, extracted
    if question is not None and restates_question(extracted, question, gold):
        return False, extracted
    return bool(verify(gold_parsed, predicted, timeout_seconds=None)), extracted


_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def restates_question(extracted: str, question: str, gold: str) -> bool:
    """Whether ``extracted`` is an expression copied from ``question`` rather than a value.

    Plain numbers and the gold answer itself never count as restatements.
    """
    answer = "".join(extracted.split())
    if not answer or answer == "".join(gold.split()) or _NUMBER.fullmatch(answer):
        return False
    return answer in "".join(question.split())


class MathEnv(Env):
    """Single-turn math: one question, one answer, reward 1.0 when math-verify finds it equal to
    the task's ``answer`` (``\\boxed{}`` first, else the last number or expression), else 0.0.

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
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
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
        self.task: dict[str, Any] | None = None

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
        correct, extracted = grade(text, str(self.task["answer"]), str(self.task["question"]))
        info = {
            "correct": float(correct),
            "extracted_answer": extracted,
            "task_id": self.task["id"],
        }
        return [], float(correct), True, False, info
