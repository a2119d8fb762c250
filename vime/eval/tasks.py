"""Where an eval's tasks come from: a user JSONL/Parquet file, else the env's own tasks (a
benchmark it ships, such as HumanEval for ``vime/Code-v0``, or a seeded procedural set)."""

from __future__ import annotations

from typing import Any

from vime.errors import ConfigError

DEFAULT_GENERATED = 32


def resolve_tasks(
    env: Any, *, path: str | None, num_tasks: int | None, seed: int
) -> list[dict[str, Any]]:
    """The task rows of a run, each with a unique string ``id``.

    ``path``: rows of that file (first ``num_tasks``). Without ``num_tasks``: the env's whole
    own set (``task_pool()`` or a ``tasks`` list) if it has one. Otherwise the env's
    ``generate_tasks(count, seed=)`` (for a benchmark, ``count`` of its rows drawn with
    ``seed``; for a generator, ``count`` new ones; 32 by default). An env with none of these
    needs ``--tasks``.
    """
    env = getattr(env, "unwrapped", env)  # --max-turns wraps the env; its tasks are inside
    if path:
        from vime.data import load_tasks

        rows = load_tasks(path)
    elif num_tasks is None and callable(getattr(env, "task_pool", None)):
        rows = env.task_pool()  # a whole benchmark by default (HumanEval for Code-v0)
    elif num_tasks is None and isinstance(getattr(env, "tasks", None), list) and env.tasks:
        rows = env.tasks
    elif callable(getattr(env, "generate_tasks", None)):
        rows = env.generate_tasks(num_tasks or DEFAULT_GENERATED, seed=seed)
    elif isinstance(getattr(env, "tasks", None), list) and env.tasks:
        rows = env.tasks
    else:
        raise ConfigError(
            f"{type(env).__name__} has no task set of its own (no generate_tasks or tasks); "
            "give --tasks FILE with one JSONL/Parquet row per task"
        )
    rows = list(rows)[:num_tasks] if num_tasks else list(rows)
    if not rows:
        raise ConfigError(f"no tasks to evaluate (source: {path or type(env).__name__})")
    seen: set[str] = set()
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "id" not in row:
            raise ConfigError(f"task {i} has no 'id' field: {str(row)[:200]}")
        task_id = str(row["id"])
        if task_id in seen:
            raise ConfigError(f"task id {task_id!r} appears twice; task ids must be unique")
        seen.add(task_id)
        out.append(row)
    return out
