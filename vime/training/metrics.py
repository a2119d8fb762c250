"""Combine per-micro-batch metrics into step metrics, across micro-batches and ranks.

Means are weighted by the number of loss tokens each micro-batch had; keys naming a maximum
(``..._max``) take the maximum; counts (``.../num_tokens``) are summed.
"""

from __future__ import annotations

import math
from typing import Any


def _kind(key: str) -> str:
    if key.endswith("_max"):
        return "max"
    if key.endswith("num_tokens"):
        return "sum"
    return "mean"


class MetricSums:
    """Running weighted sums, sums and maxima of metrics, kept where the values live.

    Values may be Python floats or 0-d tensors (float64 on the trainer's device, as
    :func:`~vime.algorithms.policy.policy_loss_tensors` returns them). Tensor values are
    folded with device operations in the same float64 arithmetic, in the same order, as
    floats would be, and read back to the host once, in :meth:`reduce`; a step's micro-batches
    therefore never wait for the GPU to drain.
    """

    def __init__(self) -> None:
        self.weighted: dict[str, Any] = {}
        self.weights: dict[str, Any] = {}
        self.sums: dict[str, Any] = {}
        self.maxima: dict[str, Any] = {}

    def add(self, metrics: dict[str, Any], weight: Any) -> None:
        """Fold in one micro-batch's metrics; ``weight`` is its number of loss tokens (a float
        or a 0-d tensor). Means skip a micro-batch of weight 0."""
        for key, value in metrics.items():
            kind = _kind(key)
            if kind == "max":
                self.maxima[key] = _maximum(self.maxima.get(key, -math.inf), value)
            elif kind == "sum":
                self.sums[key] = self.sums.get(key, 0.0) + value
            elif _is_tensor(value) or _is_tensor(weight):
                import torch

                positive = torch.as_tensor(weight) > 0
                # where(): adding nothing for weight 0 leaves the sums bit-for-bit as skipping.
                term = torch.where(positive, value * weight, 0.0)
                self.weighted[key] = self.weighted.get(key, 0.0) + term
                self.weights[key] = self.weights.get(key, 0.0) + torch.where(positive, weight, 0.0)
            elif weight > 0:
                self.weighted[key] = self.weighted.get(key, 0.0) + value * weight
                self.weights[key] = self.weights.get(key, 0.0) + weight

    def reduce(
        self, distributed: bool = False, device: str = "cpu", group: Any = None
    ) -> dict[str, float]:
        """Final metrics; with ``distributed`` they span the ranks of ``group`` (default: every
        rank; a collective call).

        A mean is reported when some micro-batch (on some rank) had a positive weight for it.
        Ranks may have seen different keys (a rank with only filler micro-batches has none);
        the union is used. ``device`` is where the collective's tensors live (cuda for nccl).
        """
        import torch

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
        columns = (
            [self.weighted.get(k, 0.0) for k in keys_sum]
            + [self.weights.get(k, 0.0) for k in keys_sum]
            + [self.sums.get(k, 0.0) for k in keys_sum]
        )
        maxima = [self.maxima.get(k, -math.inf) for k in keys_max]
        where = torch.device(device) if distributed else _device_of(columns + maxima)
        flat = _stack(columns, where)
        top = _stack(maxima, where)
        if distributed:
            import torch.distributed as dist

            dist.all_reduce(flat, group=group)
            if maxima:
                dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        # The step's one device-to-host read of its metrics.
        values = torch.cat([flat, top]).tolist()
        n = len(keys_sum)
        sums, weights, plain = values[:n], values[n : 2 * n], values[2 * n : 3 * n]
        out: dict[str, float] = {}
        for k, s, w, p in zip(keys_sum, sums, weights, plain, strict=True):
            if _kind(k) == "sum":
                out[k] = p
            elif w > 0:
                out[k] = s / w
        out.update(zip(keys_max, values[3 * n :], strict=True))
        return out


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "dtype")


def _maximum(current: Any, value: Any) -> Any:
    if _is_tensor(current) or _is_tensor(value):
        import torch

        return torch.maximum(torch.as_tensor(current, dtype=torch.float64), value.double())
    return max(current, value)


def _device_of(values: list[Any]) -> Any:
    import torch

    for v in values:
        if _is_tensor(v):
            return v.device
    return torch.device("cpu")


def _stack(values: list[Any], device: Any) -> Any:
    """One float64 vector of floats and 0-d tensors, on ``device``."""
    import torch

    return (
        torch.stack(
            [
                v.to(device=device, dtype=torch.float64).reshape(())
                if _is_tensor(v)
                else torch.tensor(float(v), dtype=torch.float64, device=device)
                for v in values
            ]
        )
        if values
        else torch.zeros(0, dtype=torch.float64, device=device)
    )
