"""``vime/ReasoningGym-v0``: the procedural datasets of the ``reasoning-gym`` package, chosen
by name and config, seeded, and graded by that package's own scorer."""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from vime.data import validate_task
from vime.envs.base import Env
from vime.envs.grading import GraderCrashed, GraderTimeout, run_graded
from vime.errors import EnvError
from vime.types import Message

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "Think the problem through step by step, then give only the final answer between "
    "<answer> and </answer>, in the format the question asks for."
)
REWARD_MODES = ("exact", "score")
TASK_KEYS = ("dataset", "config", "seed", "size", "index")


@functools.lru_cache(maxsize=64)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


def make_dataset(dataset: str, config: dict[str, Any], seed: int, size: int) -> Any:
    """The reasoning-gym ``dataset`` with ``config`` (made once per process); an unknown
    name or config key raises :class:`EnvError` with the choices."""
    name = dataset
    try:
        return _dataset(name, json.dumps(config, sort_keys=True), seed, size)
    except (ValueError, TypeError, AssertionError) as exc:
        from reasoning_gym.factory import DATASETS

        if name not in DATASETS:
            import difflib

            close = difflib.get_close_matches(name, list(DATASETS), n=5)
            raise EnvError(
                f"reasoning-gym has no dataset {name!r}; closest: {close} "
                f"({len(DATASETS)} in all: python -c 'import reasoning_gym.factory as f; "
                f"print(sorted(f.DATASETS))')"
            ) from exc
        raise EnvError(
            f"cannot make reasoning-gym dataset {name!r} with config {config}: {exc}"
        ) from exc


def score(task: dict[str, Any], answer: str | None) -> float:
    """The dataset's own score (0.0 to 1.0) of ``answer`` for the task's entry, regenerated
    from its dataset, config, seed and index (so the scorer sees the entry's exact metadata)."""
    ds = make_dataset(task["dataset"], task["config"], task["seed"], task["size"])
    return float(ds.score_answer(answer=answer, entry=ds[task["index"]]))


def extract(text: str) -> str | None:
    """The last ``<answer>...</answer>`` of a reply (None when there is none)."""
    from reasoning_gym.utils import extract_answer

    return extract_answer(text)


class ReasoningGymEnv(Env):
    """Single-turn reasoning tasks from ``reasoning-gym``.

    ``dataset`` names one of its procedural datasets (``leg_counting``, ``basic_arithmetic``,
    ``sudoku``, ...) and ``config`` gives that dataset's options (e.g. difficulty ranges);
    ``seed`` and ``size`` fix the dataset, so a task is ``(dataset, config, seed, size,
    index)`` and regenerates the same way everywhere. The model answers between ``<answer>``
    tags; the dataset's own ``score_answer`` grades it (in a killable grading worker, at most
    ``grader_timeout`` seconds, a timeout scoring 0). Some scorers give partial credit, also
    to hedges (``basic_arithmetic`` pays 0.375 for "<answer>7 or 8</answer>"), so the reward
    depends on ``reward_mode``: ``"exact"`` (default) pays 1.0 only for a score of 1.0,
    ``"score"`` pays the score itself. ``info``: ``score``, ``correct`` (1.0 when the score is
    1.0), ``extracted_answer`` and ``grader_timeout``.
    """

    def __init__(
        self,
        *,
        dataset: str = "leg_counting",
        config: dict[str, Any] | None = None,
        seed: int = 0,
        size: int = 10_000,
        system_prompt: str | None = SYSTEM_PROMPT,
        grader_timeout: float = 10.0,
        reward_mode: str = "exact",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if reward_mode not in REWARD_MODES:
            raise ValueError(
                f"unknown reward_mode {reward_mode!r}; choose one of {list(REWARD_MODES)}"
            )
        self.reward_mode = reward_mode
        if size < 1 or grader_timeout <= 0:
            raise ValueError(
                f"need size >= 1 and grader_timeout > 0, got {size!r}, {grader_timeout!r}"
            )
        self.source = {"dataset": dataset, "config": dict(config or {}), "seed": seed, "size": size}
        make_dataset(dataset, self.source["config"], seed, size)  # fail now on a bad name
        self.system_prompt = system_prompt
        self.grader_timeout = grader_timeout
        self.task: dict[str, Any] | None = None

    def task_row(self, index: int) -> dict[str, Any]:
        """Task ``index`` of this env's dataset as a row (JSON-ready)."""
        source = self.source
        entry = make_dataset(**source)[index]
        return {
            "id": f"{source['dataset']}-{source['seed']}-{index}",
            **source,
            "index": index,
            "question": entry["question"],
            "answer": str(entry["answer"]),
        }

    def generate_tasks(self, count: int, *, seed: int) -> list[dict[str, Any]]:
        """``count`` tasks of the dataset, drawn without replacement with ``seed``."""
        import numpy as np

        size = self.source["size"]
        picked = np.random.default_rng(seed).choice(size, size=min(count, size), replace=False)
        return [self.task_row(int(i)) for i in picked]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Pose one question: ``options["task"]`` or a seeded draw from the dataset."""
        super().reset(seed=seed)
        if options and options.get("task") is not None:
            task = validate_task(options["task"], (*TASK_KEYS, "question"))
        else:
            task = self.task_row(int(self.np_random.integers(self.source["size"])))
        self.task = task
        messages = [{"role": "user", "content": str(task["question"])}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages, {"task_id": task["id"]}

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict]:
        """Grade the answer with the dataset's scorer; the episode always terminates."""
        if self.task is None:
            raise EnvError("call reset() before step()")
        content = self.parse_action(action).get("content") or ""
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
        answer = extract(text)
        info: dict[str, Any] = {"grader_timeout": 0.0, "extracted_answer": answer}
        try:
            value = run_graded(score, self.task, answer, timeout=self.grader_timeout)
        except (GraderTimeout, GraderCrashed) as exc:
            log.warning("task %s: %s; the answer scores 0", self.task["id"], exc)
            info["grader_timeout" if isinstance(exc, GraderTimeout) else "grader_crashed"] = 1.0
            value = 0.0
        correct = float(value == 1.0)
        info.update(score=value, correct=correct, task_id=self.task["id"])
        return [], value if self.reward_mode == "score" else correct, True, False, info
