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
    :func:`~vime.algorithms.policy.policy_loss_tensors` returns them). Once a tensor arrives,
    the weighted means of every key are kept as two float64 vectors on its device (one entry
    per key), so a micro-batch's means fold in with a handful of device operations however
    many keys it has; the arithmetic is the float path's (float64 products and sums, in the
    same order, a key absent from a micro-batch adding exactly nothing), and everything is read
    back to the host once, in :meth:`reduce`: a step's micro-batches never wait for the GPU.
    """

    def __init__(self) -> None:
        self.weighted: dict[str, Any] = {}  # the float path's, until a tensor arrives
        self.weights: dict[str, Any] = {}
        self.sums: dict[str, Any] = {}
        self.maxima: dict[str, Any] = {}
        self._keys: list[str] = []  # the vectors' entries
        self._vectors: tuple[Any, Any] | None = None  # (weighted sums, weights), float64
        self._zero: Any = None  # a float64 0 on the vectors' device

    def add(self, metrics: dict[str, Any], weight: Any) -> None:
        """Fold in one micro-batch's metrics; ``weight`` is its number of loss tokens (a float
        or a 0-d tensor). Means skip a micro-batch of weight 0."""
        means: dict[str, Any] = {}
        for key, value in metrics.items():
            kind = _kind(key)
            if kind == "max":
                self.maxima[key] = _maximum(self.maxima.get(key, -math.inf), value)
            elif kind == "sum":
                self.sums[key] = self.sums.get(key, 0.0) + value
            else:
                means[key] = value
        if not means:
            return
        tensors = [v for v in (weight, *means.values()) if _is_tensor(v)]
        if self._vectors is None and not tensors:
            if weight > 0:
                for key, value in means.items():
                    self.weighted[key] = self.weighted.get(key, 0.0) + value * weight
                    self.weights[key] = self.weights.get(key, 0.0) + weight
            return
        self._add_means(means, weight, tensors[0].device if tensors else self._vectors[0].device)

    def _add_means(self, means: dict[str, Any], weight: Any, device: Any) -> None:
        import torch

        f64 = torch.float64
        if self._vectors is None:  # the float path's sums so far become the vectors' start
            self._keys = list(self.weighted)
            self._vectors = (_stack(list(self.weighted.values()), device),
                             _stack(list(self.weights.values()), device))  # fmt: skip
            self.weighted, self.weights = {}, {}
            self._zero = torch.zeros((), dtype=f64, device=device)
        new = [k for k in means if k not in self._keys]
        if new:
            self._keys += new
            zeros = torch.zeros(len(new), dtype=f64, device=device)
            weighted, weights = self._vectors
            self._vectors = (torch.cat([weighted, zeros]), torch.cat([weights, zeros]))
        w = torch.as_tensor(weight, dtype=f64, device=device)
        take = w > 0
        if len(means) < len(self._keys):  # keys this micro-batch lacks add exactly nothing
            present = [k in means for k in self._keys]
            take = take & torch.tensor(present, device=device)
        zero = self._zero
        values = _stack([means.get(k, zero) for k in self._keys], device)
        weighted, weights = self._vectors
        self._vectors = (
            weighted + torch.where(take, values * w, zero),
            weights + torch.where(take, w, zero),
        )

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

        if self._vectors is not None:  # one 0-d view per key: no device work
            weighted, weights = self._vectors
            self.weighted = {k: weighted[i] for i, k in enumerate(self._keys)}
            self.weights = {k: weights[i] for i, k in enumerate(self._keys)}
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
