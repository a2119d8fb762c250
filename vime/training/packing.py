"""Share a batch out across ranks and pack it into micro-batches under a token budget.

Sequences are concatenated without padding; position ids restart at 0 for each sequence, which
is how transformers models (sdpa/eager: block-diagonal mask; flash: varlen) keep attention
inside each sequence when no attention mask is given.

With shared prompts (:func:`prompt_units`), samples of a micro-batch that start with the same
prompt (a GRPO group's samples) hold it once: the row keeps the prompt's first ``p - 1``
tokens as one segment, then one segment per sample starting at the prompt's last token, which
attends to that shared segment as if it preceded it (:attr:`PackedInputs.parents`). Repeating
the prompt's last token in each sample's segment keeps the one rule of a packed row, that row
``t`` scores the token at ``t + 1``, for every token a sample is scored on.
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
    lengths: Sequence[int],
    max_tokens: int,
    world_size: int = 1,
    units: Sequence[tuple[Sequence[int], int]] | None = None,
) -> list[list[MicroBatch]]:
    """The micro-batches of every rank, padded with dummies to the same count on each rank.

    ``units`` (from :func:`prompt_units`) are groups of sample indices that must share a
    micro-batch, each with its packed token cost; by default every sample is its own unit.
    Every rank computes the same plan from the same lengths, so no communication is needed.
    """
    _check_lengths(lengths, max_tokens)
    if not lengths:
        raise ValueError("cannot plan micro-batches for an empty batch")
    if units is None:
        units = [((i,), n) for i, n in enumerate(lengths)]
    covered = sorted(i for members, _ in units for i in members)
    if covered != list(range(len(lengths))):
        raise ValueError(f"the packing units cover samples {covered[:8]}, not each sample once")
    costs = [cost for _, cost in units]
    per_rank = []
    for share in split_across_ranks(costs, world_size):
        bins = pack(costs, max_tokens, share)
        per_rank.append(
            [
                MicroBatch(tuple(sorted(i for u in b.indices for i in units[u][0])), b.num_tokens)
                for b in bins
            ]
        )
    count = max(len(mbs) for mbs in per_rank)
    filler = MicroBatch((0,), 1, dummy=True)
    return [mbs + [filler] * (count - len(mbs)) for mbs in per_rank]


def prompt_length(sample: TrainSample) -> int:
    """Tokens before the sample's first loss-mask token (its whole length if it has none):
    the prompt that samples of one group share."""
    return next((j for j, m in enumerate(sample.loss_mask) if m), sample.num_tokens)


def shared_cost(prompt: int, lengths: Sequence[int]) -> int:
    """Packed tokens of samples of ``lengths`` sharing a ``prompt``-token prompt: its first
    ``prompt - 1`` tokens once, then each sample from the prompt's last token on."""
    if len(lengths) < 2 or prompt < 2:
        return sum(lengths)
    return prompt - 1 + sum(n - prompt + 1 for n in lengths)


def _prompt_groups(
    samples: Sequence[TrainSample], indices: Sequence[int]
) -> list[tuple[list[int], int]]:
    """``indices`` grouped by identical prompt, in order of first appearance, each with the
    length it shares (0: a group of one, or a prompt too short to share)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in indices:
        s = samples[i]
        groups.setdefault(tuple(s.token_ids[: prompt_length(s)]), []).append(i)
    return [(g, len(key) if len(g) > 1 and len(key) > 1 else 0) for key, g in groups.items()]


def prompt_units(samples: Sequence[TrainSample], max_tokens: int) -> list[tuple[list[int], int]]:
    """Units for :func:`plan_micro_batches` that keep samples with the same prompt in one
    micro-batch, each with its shared cost; a group over ``max_tokens`` is split (longest
    samples first), each part holding the prompt once."""
    units: list[tuple[list[int], int]] = []
    for group, prompt in _prompt_groups(samples, range(len(samples))):
        if not prompt:
            units += [([i], samples[i].num_tokens) for i in group]
            continue
        part: list[int] = []
        for i in sorted(group, key=lambda i: (-samples[i].num_tokens, i)):
            lengths = [samples[j].num_tokens for j in [*part, i]]
            if part and shared_cost(prompt, lengths) > max_tokens:
                units.append((part, shared_cost(prompt, lengths[:-1])))
                part = []
            part.append(i)
        units.append((part, shared_cost(prompt, [samples[j].num_tokens for j in part])))
    return units


@dataclass
class PackedInputs:
    """Model inputs of one micro-batch: ``[1, T]`` ids and position ids plus segment bounds.

    ``cu_seqlens`` bounds the row's segments (without shared prompts, one per sample).
    ``parents``, when set, gives each segment the index of the shared-prompt segment it
    continues (``-1``: none); such a segment attends to all of its parent, then causally to
    itself. ``pieces`` gives each sample (in micro-batch order) the row ranges whose values,
    after a leading 0.0, are its per-token values (:meth:`unpack`). ``scored_rows``, when set,
    lists the rows (``0 .. T-2``; row ``t`` scores the token at ``t + 1``) that score a
    loss-mask token: the only rows a loss reads.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: list[int]
    scored_rows: torch.Tensor | None = None
    parents: list[int] | None = None
    pieces: list[list[tuple[int, int]]] | None = None

    @property
    def num_tokens(self) -> int:
        """Total packed length T."""
        return self.cu_seqlens[-1]

    def unpack(self, per_row: torch.Tensor) -> list[torch.Tensor]:
        """Each sample's ``[length]`` values from the ``[T - 1]`` values of the row's logits
        rows (entry 0, which nothing predicts, is 0.0)."""
        if self.pieces is None:
            return unpack_shifted(per_row, self.cu_seqlens)
        import torch

        zero = per_row.new_zeros(1)
        return [torch.cat([zero, *(per_row[a:b] for a, b in p)]) for p in self.pieces]


def pack_inputs(
    samples: Sequence[TrainSample],
    micro_batch: MicroBatch,
    *,
    loss_rows_only: bool = False,
    share_prompts: bool = False,
) -> PackedInputs:
    """Concatenate the micro-batch's sequences (or the dummy's single token) into one row;
    with ``loss_rows_only`` also list the rows of loss-mask tokens (``scored_rows``); with
    ``share_prompts`` samples with the same prompt hold it once (the module's docstring)."""
    import torch

    if micro_batch.dummy:
        ids = torch.tensor([samples[micro_batch.indices[0]].token_ids[:1]], dtype=torch.long)
        return PackedInputs(ids, torch.zeros_like(ids), [0, 1])
    groups = (
        _prompt_groups(samples, micro_batch.indices)
        if share_prompts
        else [([i], 0) for i in micro_batch.indices]
    )
    tokens: list[int] = []
    positions: list[int] = []
    cu, parents = [0], []
    runs_of: dict[int, list[tuple[int, int]]] = {}  # sample -> the row runs of its tokens

    def segment(ids: Sequence[int], first: int, parent: int) -> tuple[int, int]:
        start = cu[-1]
        tokens.extend(ids)
        positions.extend(range(first, first + len(ids)))
        cu.append(start + len(ids))
        parents.append(parent)
        return start, cu[-1]

    for group, prompt in groups:
        if not prompt:
            for i in group:
                runs_of[i] = [segment(samples[i].token_ids, 0, -1)]
            continue
        parent = len(parents)
        shared = segment(samples[group[0]].token_ids[: prompt - 1], 0, -1)
        for i in group:
            runs_of[i] = [shared, segment(samples[i].token_ids[prompt - 1 :], prompt - 1, parent)]
    ids = torch.tensor([tokens], dtype=torch.long)
    pos = torch.tensor([positions], dtype=torch.long)
    rows = None
    if loss_rows_only:
        # Token j >= 1 is scored by the row of token j - 1; token 0 by none.
        scored = [
            torch.cat([torch.arange(a, b) for a, b in runs_of[i]])[:-1][
                torch.tensor(samples[i].loss_mask[1:], dtype=torch.bool)
            ]
            for i in micro_batch.indices
        ]
        rows = torch.cat(scored).sort().values
    if not share_prompts:
        return PackedInputs(ids, pos, cu, rows)
    # A sample's values are those of the rows of its tokens 0 .. n-2: its runs but the last row.
    pieces = [_without_last_row(runs_of[i]) for i in micro_batch.indices]
    return PackedInputs(ids, pos, cu, rows, parents, pieces)


def _without_last_row(runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``runs`` of rows, less the last row (a run left empty is dropped)."""
    *head, (a, b) = runs
    return [*head, (a, b - 1)] if b - 1 > a else list(head)


def unpack_shifted(per_row: torch.Tensor, cu_seqlens: Sequence[int]) -> list[torch.Tensor]:
    """Per-sequence tensors from values of a packed row's logits rows: row t scores token t + 1.

    The row before each sequence's start (the previous sequence's last token) is dropped and
    entry 0 of each sequence is 0.0, which nothing predicts.
    """
    import torch

    zero = per_row.new_zeros(1)
    return [torch.cat([zero, per_row[a : b - 1]]) for a, b in itertools.pairwise(cu_seqlens)]
