"""The output dir of an eval: its config (``config.json``) and one ``results.jsonl`` line per
finished (task, sample), appended and flushed as each finishes so a killed run resumes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vime.errors import ConfigError

RESULTS = "results.jsonl"
CONFIG = "config.json"


class ResultStore:
    """Results of one eval config in ``directory``; opening checks the config matches."""

    def __init__(self, directory: str | Path, identity: dict[str, Any], *, overwrite: bool) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.results_path = self.dir / RESULTS
        config_path = self.dir / CONFIG
        stored = json.loads(config_path.read_text()) if config_path.exists() else None
        if stored is not None and stored != identity:
            if not overwrite:
                changed = sorted(
                    k for k in {*stored, *identity} if stored.get(k) != identity.get(k)
                )
                raise ConfigError(
                    f"{self.dir} holds results of a different eval config (changed: "
                    f"{', '.join(changed)}); use another --output, or --overwrite to delete "
                    "those results and start over"
                )
            self.results_path.unlink(missing_ok=True)
        elif stored is None and self.results_path.exists() and not overwrite:
            raise ConfigError(
                f"{self.results_path} exists without {CONFIG}; use another --output or --overwrite"
            )
        elif stored is None:
            self.results_path.unlink(missing_ok=True)
        tmp = config_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(identity, indent=2, sort_keys=True))
        os.replace(tmp, config_path)
        self.results: dict[tuple[str, int], dict[str, Any]] = {}
        self._load()
        self._file = open(self.results_path, "a", encoding="utf-8")  # noqa: SIM115

    def _load(self) -> None:
        if not self.results_path.exists():
            return
        data = self.results_path.read_bytes()
        # A kill -9 mid-write leaves a partial last line: drop it so appends start clean.
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with open(self.results_path, "r+b") as f:
                f.truncate(end)
        for line in data[:end].decode("utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                # A later line for the same sample (a retried failure) supersedes the earlier.
                self.results[(str(row["task_id"]), int(row["sample_index"]))] = row

    def done(self, task_id: str, sample_index: int, *, retry_failed: bool = False) -> bool:
        """Whether the sample has a result (a failed one counts unless ``retry_failed``)."""
        row = self.results.get((task_id, sample_index))
        return row is not None and not (retry_failed and row.get("error"))

    def append(self, row: dict[str, Any]) -> None:
        """Record one finished sample (one line, flushed to the OS at once)."""
        self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()
        self.results[(str(row["task_id"]), int(row["sample_index"]))] = row

    def close(self) -> None:
        """Close the results file."""
        self._file.close()
