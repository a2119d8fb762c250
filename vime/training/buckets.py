"""Grouping named tensors into size-bounded buckets for weight export and transfer.

One implementation serves both trainer backends' ``export_weights`` and the inference side's
shared-memory writer, so a bucket means the same thing wherever weights move.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024


def bucket_tensors(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group ``(name, tensor)`` pairs into lists of at most ``bucket_bytes``, keeping order.

    A tensor larger than ``bucket_bytes`` gets a bucket of its own rather than an error, so
    one huge embedding never blocks an export.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    return _buckets(named, bucket_bytes)


def _buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
