"""What ``vime view`` reads: a ``vime train`` output dir, a ``vime eval`` output dir or a
``vime rollout`` JSONL file, as one :class:`RunSource` (metrics, eval summary, episode rows)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vime.errors import ConfigError
from vime.orchestration.metrics_log import read_metric_rows

Kind = Literal["train", "eval", "rollout"]


@dataclass
class RunSource:
    """One run to view.

    ``history`` holds the per-step metric rows of a train run (``metrics.jsonl``);
    ``eval_summary`` the ``summary.json`` of an eval; ``files`` the JSONL files whose lines
    are episodes (trajectory dumps, ``results.jsonl`` rows or a rollout file), in order.
    ``tokenizer`` is a model folder whose ``tokenizer.json`` turns token ids into text.
    """

    kind: Kind
    path: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    eval_summary: dict[str, Any] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    tokenizer: str | None = None

    @property
    def title(self) -> str:
        """A one-line name of the run for the page's heading."""
        if self.kind == "eval" and self.eval_summary:
            return f"eval of {self.eval_summary.get('model')} on {self.eval_summary.get('env')}"
        return f"{self.kind} run {self.path.name}"

    @property
    def default_env(self) -> str:
        """The env id of episodes that do not name their own."""
        rollout = self.config.get("rollout") or {}
        return str(rollout.get("env_id") or self.config.get("env") or "")

    def records(self) -> Iterator[dict[str, Any]]:
        """Every episode as a JSON object, file after file (a partial last line, as a run
        still writing leaves it, is skipped)."""
        for path in self.files:
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError:
                        if not line.endswith("\n"):
                            break  # the writer is mid-line
                        raise ConfigError(f"{path}:{number}: not a JSON line") from None
                    if not isinstance(record, dict):
                        raise ConfigError(f"{path}:{number}: expected a JSON object per line")
                    yield record


def open_run(path: str | Path, *, tokenizer: str | None = None) -> RunSource:
    """Recognise what ``path`` is and read its metrics and summary; raises ``ConfigError``
    naming what was expected when it is none of the three."""
    path = Path(path)
    if path.is_file():
        return RunSource("rollout", path, files=[path], tokenizer=tokenizer)
    if not path.is_dir():
        raise ConfigError(f"{path} does not exist; give a train or eval output dir or a JSONL file")
    config = _read_json(path / "config.json") or {}
    if (path / "results.jsonl").is_file() or (path / "summary.json").is_file():
        summary = _read_json(path / "summary.json")
        files = [path / "results.jsonl"] if (path / "results.jsonl").is_file() else []
        return RunSource("eval", path, eval_summary=summary, config=config, files=files)
    dumps = sorted((path / "trajectories").glob("step_*.jsonl"))
    if not dumps and not (path / "metrics.jsonl").is_file():
        raise ConfigError(
            f"{path} is not a vime train dir (no metrics.jsonl or trajectories/step_*.jsonl) "
            "nor a vime eval dir (no results.jsonl); give one of those or a rollout JSONL file"
        )
    history = list(read_metric_rows(path / "metrics.jsonl"))
    model = tokenizer or (config.get("run") or {}).get("model")
    return RunSource("train", path, history=history, config=config, files=dumps, tokenizer=model)


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc})") from None
