"""Combine per-micro-batch metrics into step metrics, across micro-batches and ranks.

Means are weighted by the number of loss tokens each micro-batch had; keys naming a maximum
(``..._max``) take the maximum; counts (``.../num_tokens``) are summed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any


def _kind(key: str) -> str:
    if key.endswith("_max"):
        return "max"
    if key.endswith("num_tokens"):
        return "sum"
    return "mean"


class MetricSums:
    """Running weighted sums, sums and maxima of float metrics."""

    def __init__(self) -> None:
        self.weighted: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)
        self.sums: dict[str, float] = defaultdict(float)
        self.maxima: dict[str, float] = {}

    def add(self, metrics: dict[str, float], weight: float) -> None:
        """Fold in one micro-batch's metrics; ``weight`` is its number of loss tokens."""
        for key, value in metrics.items():
            kind = _kind(key)
            if kind == "max":
                self.maxima[key] = max(self.maxima.get(key, -math.inf), value)
            elif kind == "sum":
                self.sums[key] += value
            elif weight > 0:
                self.weighted[key] += value * weight
                self.weights[key] += weight

    def reduce(
        self, distributed: bool = False, device: str = "cpu", group: Any = None
    ) -> dict[str, float]:
        """Final metrics; with ``distributed`` they span the ranks of ``group`` (default: every
        rank; a collective call).

        Ranks may have seen different keys (a rank with only filler micro-batches has none);
        the union is used. ``device`` is where the collective's tensors live (cuda for nccl).
        """
        keys_sum = set(self.weighted) | set(self.sums)
        keys_max = set(self.maxima)
        if distributed:
            import torch.distributed as dist

            seen: list[tuple[set[str], set[str]] | None] = [None] * dist.get_world_size(group)
            dist.all_gather_object(seen, (keys_sum, keys_max), group=group)
            for ks, km in filter(None, seen):
                keys_sum |= ks
                keys_max |= km
        keys_sum, keys_max = sorted(keys_sum), sorted(keys_max)
        sums = [self.weighted.get(k, 0.0) for k in keys_sum]
        weights = [self.weights.get(k, 0.0) for k in keys_sum]
        plain = [self.sums.get(k, 0.0) for k in keys_sum]
        maxima = [self.maxima.get(k, -math.inf) for k in keys_max]
        if distributed:
            sums, weights, plain, maxima = _all_reduce(sums, weights, plain, maxima, device, group)
        out: dict[str, float] = {}
        for k, s, w, p in zip(keys_sum, sums, weights, plain, strict=True):
            out[k] = p if _kind(k) == "sum" else (s / w if w > 0 else 0.0)
        out.update(zip(keys_max, maxima, strict=True))
        return out


def _all_reduce(
    sums: list[float],
    weights: list[float],
    plain: list[float],
    maxima: list[float],
    device: str,
    group: Any,
) -> tuple[list[float], list[float], list[float], list[float]]:
    import torch
    import torch.distributed as dist

    n = len(sums)
    t = torch.tensor(sums + weights + plain, dtype=torch.float64, device=device)
    dist.all_reduce(t, group=group)
    m = torch.tensor(maxima, dtype=torch.float64, device=device)
    if maxima:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    values = t.tolist()
    return values[:n], values[n : 2 * n], values[2 * n :], m.tolist()
