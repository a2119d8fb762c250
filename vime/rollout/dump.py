"""JSONL dumps of trajectories for debugging and replay: one trajectory per line."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from vime.types import Trajectory


def trajectory_line(trajectory: Trajectory, **extra: Any) -> str:
    """One JSON line: every Trajectory field (``token_ids``, ``loss_mask``, ``logprobs``,
    ``prompt_length``, ``messages``, ``reward``, ``status``, ``weight_versions``, ...) plus
    ``extra`` keys."""
    return json.dumps({**trajectory.to_dict(), **extra}, default=_jsonable, ensure_ascii=False)


def write_jsonl(trajectories: Iterable[Trajectory], out: str | Path | IO[str], **extra: Any) -> int:
    """Append ``trajectories`` to ``out`` (a path or an open text file); return the count."""
    if isinstance(out, str | Path):
        with open(out, "a", encoding="utf-8") as f:
            return write_jsonl(trajectories, f, **extra)
    count = 0
    for trajectory in trajectories:
        out.write(trajectory_line(trajectory, **extra) + "\n")
        count += 1
    out.flush()
    return count


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    """Trajectories from a dump written by :func:`write_jsonl` (extra keys go to metadata)."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Trajectory.from_dict(json.loads(line))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a trajectory line ({exc})") from exc


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_openai"):
        return value.to_openai()
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return str(value)
