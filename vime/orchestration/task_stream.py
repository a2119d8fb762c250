"""A resumable stream of training tasks: seeded shuffle per epoch, addressed by position."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any


class TaskStream:
    """Tasks in a seeded order that reshuffles every epoch.

    The stream is addressed by a global ``position`` (tasks consumed so far), so a resume
    continues exactly where the checkpoint stopped, and every task drawn gets a sample id
    ``<task id>@<position>`` that is unique over the whole run.
    """

    def __init__(self, tasks: Sequence[dict[str, Any]], seed: int, position: int = 0) -> None:
        if not tasks:
            raise ValueError("the task set is empty: give --tasks FILE or a generator with rows")
        self.tasks = list(tasks)
        self.seed = seed
        self.position = position
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.tasks)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}  # keep only the current epoch's order
        return self._orders[epoch]

    def peek(self, position: int) -> dict[str, Any]:
        """The task at a global position, without consuming it."""
        epoch, index = divmod(position, len(self.tasks))
        return self.tasks[self._order(epoch)[index]]

    def take(self, count: int) -> list[tuple[str, dict[str, Any]]]:
        """Consume ``count`` tasks; returns ``(sample_id, task)`` pairs."""
        out = []
        for _ in range(count):
            task = self.peek(self.position)
            out.append((f"{task.get('id', '?')}@{self.position}", task))
            self.position += 1
        return out
