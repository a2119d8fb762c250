"""Share a batch out across ranks and pack it into micro-batches under a token budget.

Sequences are concatenated without padding; position ids restart at 0 for each sequence, which
is how transformers models (sdpa/eager: block-diagonal mask; flash: varlen) keep attention
inside each sequence when no attention mask is given.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from vime.training.batch import TrainSample


@dataclass(frozen=True)
class MicroBatch:
    """Sample indices packed together; ``dummy`` marks a filler that keeps ranks in lockstep.

    A dummy micro-batch holds one token of a sample and must contribute zero loss: it exists
    only so every rank runs the same number of forward/backward passes (FSDP collectives).
    """

    indices: tuple[int, ...]
    num_tokens: int
    dummy: bool = False


def _check_lengths(lengths: Sequence[int], max_tokens: int) -> None:
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    for i, n in enumerate(lengths):
        if n <= 0:
            raise ValueError(f"sample {i} has {n} tokens; every sample needs at least one")
        if n > max_tokens:
            raise ValueError(
                f"sample {i} has {n} tokens, more than the micro-batch budget of {max_tokens}; "
                "raise --max-tokens-per-micro-batch or cap the rollout length"
            )


def pack(
    lengths: Sequence[int], max_tokens: int, indices: Sequence[int] | None = None
) -> list[MicroBatch]:
    """First-fit-decreasing bins of sample indices, each bin at most ``max_tokens`` tokens.

    ``indices`` selects which samples to pack (default: all). Ties keep index order, so the
    plan is deterministic; each bin lists its indices in ascending order.
    """
    chosen = list(range(len(lengths))) if indices is None else list(indices)
    _check_lengths([lengths[i] for i in chosen], max_tokens)
    order = sorted(chosen, key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for b, load in enumerate(loads):
            if load + lengths[i] <= max_tokens:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return [MicroBatch(tuple(sorted(b)), load) for b, load in zip(bins, loads, strict=True)]


def split_across_ranks(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Deal samples to ranks balancing tokens: longest first, each to the least-loaded rank."""
    if world_size <= 0:
        raise ValueError(f"world_size must be > 0, got {world_size}")
    shares: list[list[int]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(world_size), key=lambda r: (loads[r], r))
        shares[r].append(i)
        loads[r] += lengths[i]
    return [sorted(s) for s in shares]


def plan_micro_batches(
    lengths: Sequence[int], max_tokens: int, world_size: int = 1
) -> list[list[MicroBatch]]:
    """The micro-batches of every rank, padded with dummies to the same count on each rank.

    Every rank computes the same plan from the same lengths, so no communication is needed.
    """
    _check_lengths(lengths, max_tokens)
    if not lengths:
        raise ValueError("cannot plan micro-batches for an empty batch")
    per_rank = [
        pack(lengths, max_tokens, share) for share in split_across_ranks(lengths, world_size)
    ]
    count = max(len(mbs) for mbs in per_rank)
    filler = MicroBatch((0,), 1, dummy=True)
    return [mbs + [filler] * (count - len(mbs)) for mbs in per_rank]


@dataclass
class PackedInputs:
    """Model inputs of one micro-batch: ``[1, T]`` ids and position ids plus sequence bounds.

    ``scored_rows``, when set, lists the logits rows (``0 .. T-2``; row ``t`` scores token
    ``t + 1``) whose token is in its sample's loss mask: the only rows a loss reads.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: list[int]
    scored_rows: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Total packed length T."""
        return self.cu_seqlens[-1]


def pack_inputs(
    samples: Sequence[TrainSample], micro_batch: MicroBatch, *, loss_rows_only: bool = False
) -> PackedInputs:
    """Concatenate the micro-batch's sequences (or the dummy's single token) into one row;
    with ``loss_rows_only`` also list the rows of loss-mask tokens (``scored_rows``)."""
    import torch

    if micro_batch.dummy:
        seqs = [samples[micro_batch.indices[0]].token_ids[:1]]
    else:
        seqs = [samples[i].token_ids for i in micro_batch.indices]
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + len(s))
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.long).unsqueeze(0)
    pos = torch.cat([torch.arange(len(s), dtype=torch.long) for s in seqs]).unsqueeze(0)
    rows = None
    if loss_rows_only and not micro_batch.dummy:
        # Token j >= 1 of a sequence starting at a is scored by row a + j - 1; token 0 by none.
        rows = torch.tensor(
            [
                a + j - 1
                for a, i in zip(cu[:-1], micro_batch.indices, strict=True)
                for j, m in enumerate(samples[i].loss_mask)
                if j and m
            ],
            dtype=torch.long,
        )
    return PackedInputs(ids, pos, cu, rows)


def unpack_shifted(per_row: torch.Tensor, cu_seqlens: Sequence[int]) -> list[torch.Tensor]:
    """Per-sequence tensors from values of a packed row's logits rows: row t scores token t + 1.

    The row before each sequence's start (the previous sequence's last token) is dropped and
    entry 0 of each sequence is 0.0, which nothing predicts.
    """
    import torch

    zero = per_row.new_zeros(1)
    return [torch.cat([zero, per_row[a : b - 1]]) for a, b in itertools.pairwise(cu_seqlens)]
