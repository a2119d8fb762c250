"""Metrics of a run: TensorBoard by default, wandb when asked, a JSONL copy, a final summary."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Writes one row of scalar metrics per step to every sink.

    ``metrics.jsonl`` in ``log_dir`` is always written (one JSON object per step, appended and
    flushed so a crash loses nothing already logged); TensorBoard event files go to
    ``log_dir/tensorboard``; wandb is used only when ``wandb_project`` is set.
    """

    def __init__(
        self, log_dir: str | Path, *, wandb_project: str | None = None, run_name: str = "vime"
    ) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.history: list[dict[str, float]] = []
        self._jsonl = (self.log_dir / "metrics.jsonl").open("a")
        from torch.utils.tensorboard import SummaryWriter

        self.tensorboard_dir = self.log_dir / "tensorboard"
        self._tb = SummaryWriter(str(self.tensorboard_dir))
        self._wandb = None
        if wandb_project:
            try:
                import wandb
            except ImportError:
                raise RuntimeError(
                    "--wandb-project needs the wandb package: pip install wandb"
                ) from None
            self._wandb = wandb.init(project=wandb_project, name=run_name, dir=str(self.log_dir))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record the scalar metrics of ``step`` (non-numbers and NaNs are skipped)."""
        row = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        self.history.append({"step": step, **row})
        self._jsonl.write(json.dumps({"step": step, "time": time.time(), **row}) + "\n")
        self._jsonl.flush()
        for k, v in row.items():
            self._tb.add_scalar(k, v, step)
        self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(row, step=step)

    def close(self) -> None:
        """Flush and close every sink."""
        self._jsonl.close()
        self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metric_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (none when it does not exist), skipping a line that is
    not a JSON object: the last one of a run still writing, or cut short by a crash."""
    path = Path(path)
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            yield row


def summary_table(history: list[dict[str, float]], keys: list[str]) -> str:
    """A plain-text table of the first and last value (and mean) of ``keys`` over a run."""
    rows = [("metric", "first", "last", "mean")]
    for key in keys:
        values = [h[key] for h in history if key in h]
        if not values:
            continue
        rows.append(
            (key, f"{values[0]:.4g}", f"{values[-1]:.4g}", f"{sum(values) / len(values):.4g}")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
