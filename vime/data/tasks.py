"""Loading task files (JSONL or Parquet rows with an ``id``) with errors that name the file
and the line or row at fault."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vime.errors import VimeError

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


class TaskFileError(VimeError, ValueError):
    """A task file is missing, unreadable or has a bad row."""


def validate_task(row: Any, required: Iterable[str] = (), *, where: str = "task") -> dict[str, Any]:
    """Check one task row: a dict with a non-empty ``id`` (str or int) and the ``required`` keys.

    Returns the row with ``id`` as a str; raises :class:`TaskFileError` naming ``where``.
    """
    if not isinstance(row, Mapping):
        raise TaskFileError(f"{where}: a task must be a JSON object, got {type(row).__name__}")
    task = dict(row)
    task_id = task.get("id")
    if isinstance(task_id, bool) or not isinstance(task_id, str | int) or task_id == "":
        raise TaskFileError(
            f"{where}: every task needs an 'id' (a non-empty string or an integer), got "
            f"{task_id!r}; keys present: {sorted(task)}"
        )
    missing = [key for key in required if key not in task]
    if missing:
        raise TaskFileError(
            f"{where} (id {task_id!r}): missing key(s) {missing}; this env needs "
            f"{['id', *required]}, the row has {sorted(task)}"
        )
    task["id"] = str(task_id)
    return task


def load_tasks(path: str | Path, *, required: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Read tasks from a ``.jsonl`` or ``.parquet`` file, checking each row.

    Every row needs ``id`` (unique in the file, returned as a str) and the ``required`` keys.
    Blank JSONL lines are skipped. Raises :class:`TaskFileError` naming the file and the line
    (JSONL) or row (Parquet, counted from 1) that is wrong.
    """
    path = Path(path)
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise TaskFileError(
            f"{path}: unknown task file type {path.suffix!r}; use one of {sorted(SUFFIXES)}"
        )
    if not path.is_file():
        raise TaskFileError(f"{path}: task file not found")
    required = tuple(required)
    rows = _jsonl_rows(path) if kind == "jsonl" else _parquet_rows(path)
    tasks: list[dict[str, Any]] = []
    first_seen: dict[str, str] = {}
    for where, row in rows:
        task = validate_task(row, required, where=where)
        if task["id"] in first_seen:
            raise TaskFileError(
                f"{where}: duplicate task id {task['id']!r} (first at {first_seen[task['id']]}); "
                f"ids must be unique"
            )
        first_seen[task["id"]] = where
        tasks.append(task)
    if not tasks:
        raise TaskFileError(f"{path}: the file has no tasks")
    return tasks


def _jsonl_rows(path: Path) -> Iterable[tuple[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{number}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskFileError(
                    f"{path}:{number}: invalid JSON ({exc.msg} at column {exc.colno}): "
                    f"{line.strip()[:120]!r}"
                ) from exc


def _parquet_rows(path: Path) -> Iterable[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise TaskFileError(
            f"{path}: reading Parquet needs pyarrow: pip install pyarrow (or use JSONL)"
        ) from exc
    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise TaskFileError(f"{path}: not a readable Parquet file: {exc}") from exc
    for number, row in enumerate(table.to_pylist(), 1):
        yield f"{path} row {number}", row


def draw_tasks(pool: Sequence[dict[str, Any]], count: int, *, seed: int) -> list[dict[str, Any]]:
    """Copies of ``count`` rows of ``pool`` drawn without replacement with ``seed`` (all of
    them, in order, when ``count`` covers the pool): an env's ``generate_tasks`` over a
    fixed benchmark."""
    if count >= len(pool):
        return [dict(t) for t in pool]
    import numpy as np

    picked = np.random.default_rng(seed).choice(len(pool), size=count, replace=False)
    return [dict(pool[int(i)]) for i in picked]
