"""Training samples and batches: per-token lists aligned with ``token_ids``, validated on entry.

Token convention: ``logprobs[i]`` is log p(token_ids[i] | token_ids[:i]); positions outside the
loss mask hold 0.0, and index 0 (which nothing predicts) is never in the mask.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from vime.types import Trajectory

# Engines round logprobs; a value this far above 0 is a bug upstream, not noise.
_LOGPROB_SLACK = 1e-4


@dataclass
class TrainSample:
    """One sequence to train on.

    ``advantages`` is per token (0.0 outside the mask by convention); ``rollout_logprobs`` are
    the engine's logprobs of the sampled tokens; ``old_logprobs`` (the trainer's logprobs before
    the update, for PPO ratios) and ``ref_logprobs`` (a reference policy, for KL) are optional.
    Construction raises ``ValueError`` naming the field, the sample and the offending index when
    lengths differ or logprobs are not aligned with the mask.
    """

    token_ids: list[int]
    loss_mask: list[int]
    advantages: list[float]
    rollout_logprobs: list[float]
    old_logprobs: list[float] | None = None
    ref_logprobs: list[float] | None = None
    sample_id: str = ""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        who = f"sample {self.sample_id!r}" if self.sample_id else "sample"
        if n == 0:
            raise ValueError(f"{who}: token_ids is empty; a sample needs at least one token")
        for i, tok in enumerate(self.token_ids):
            if not isinstance(tok, int) or isinstance(tok, bool) or tok < 0:
                raise ValueError(f"{who}: token_ids[{i}] = {tok!r} is not a non-negative int")
        for name in ("loss_mask", "advantages", "rollout_logprobs", "old_logprobs", "ref_logprobs"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(
                    f"{who}: {name} has {len(values)} entries but token_ids has {n}; every "
                    "per-token list must be aligned with token_ids"
                )
        for i, m in enumerate(self.loss_mask):
            if m not in (0, 1):
                raise ValueError(f"{who}: loss_mask[{i}] = {m!r}, expected 0 or 1")
        if self.loss_mask[0]:
            raise ValueError(
                f"{who}: loss_mask[0] is 1, but the first token has no context to be predicted "
                "from; the mask must start with a prompt token"
            )
        for i, a in enumerate(self.advantages):
            if not math.isfinite(a):
                raise ValueError(f"{who}: advantages[{i}] = {a!r} is not finite")
        for name in ("rollout_logprobs", "old_logprobs", "ref_logprobs"):
            values = getattr(self, name)
            if values is not None:
                self._check_logprobs(who, name, values)

    def _check_logprobs(self, who: str, name: str, values: Sequence[float]) -> None:
        for i, (lp, m) in enumerate(zip(values, self.loss_mask, strict=True)):
            if not math.isfinite(lp) or lp > _LOGPROB_SLACK:
                raise ValueError(f"{who}: {name}[{i}] = {lp!r} is not a finite log-probability")
            if not m and lp != 0.0:
                raise ValueError(
                    f"{who}: {name}[{i}] = {lp!r} but loss_mask[{i}] is 0; logprobs must be 0.0 "
                    "outside the loss mask (are the logprobs shifted by one token against "
                    "token_ids?)"
                )

    @property
    def num_tokens(self) -> int:
        """Length of the sequence."""
        return len(self.token_ids)

    @property
    def num_loss_tokens(self) -> int:
        """Number of tokens the loss is computed on."""
        return sum(self.loss_mask)

    @classmethod
    def from_trajectory(
        cls, trajectory: Trajectory, advantages: float | Sequence[float], sample_id: str = ""
    ) -> TrainSample:
        """A sample from an episode; a scalar advantage is broadcast over the sampled tokens.

        Per-token ``advantages`` must have one entry per token; entries outside the loss mask
        are set to 0.0. The sample id defaults to ``"<task_id>/<sample_index>"``.
        """
        mask = list(trajectory.loss_mask)
        if isinstance(advantages, int | float):
            adv = [float(advantages) if m else 0.0 for m in mask]
        else:
            if len(advantages) != len(mask):
                raise ValueError(
                    f"trajectory {trajectory.task_id!r}/{trajectory.sample_index}: got "
                    f"{len(advantages)} advantages for {len(mask)} tokens"
                )
            adv = [float(a) if m else 0.0 for a, m in zip(advantages, mask, strict=True)]
        return cls(
            token_ids=list(trajectory.token_ids),
            loss_mask=mask,
            advantages=adv,
            rollout_logprobs=[float(x) for x in trajectory.logprobs],
            sample_id=sample_id or f"{trajectory.task_id}/{trajectory.sample_index}",
        )


@dataclass
class TrainBatch:
    """The samples of one optimizer step (the global batch, identical on every rank)."""

    samples: list[TrainSample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.samples = list(self.samples)
        for i, s in enumerate(self.samples):
            if not isinstance(s, TrainSample):
                raise TypeError(f"TrainBatch.samples[{i}] is a {type(s).__name__}, not TrainSample")

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[TrainSample]:
        return iter(self.samples)

    def __getitem__(self, index: int) -> TrainSample:
        return self.samples[index]

    @property
    def num_tokens(self) -> int:
        """Tokens in all sequences (prompt included): the compute the batch costs."""
        return sum(s.num_tokens for s in self.samples)

    @property
    def num_loss_tokens(self) -> int:
        """Tokens the loss is computed on, over all samples."""
        return sum(s.num_loss_tokens for s in self.samples)

    @classmethod
    def from_trajectories(
        cls,
        trajectories: Sequence[Trajectory],
        advantages: Sequence[float] | Sequence[Sequence[float]],
    ) -> TrainBatch:
        """A batch from episodes and their advantages (one scalar or per-token list each)."""
        if len(trajectories) != len(advantages):
            raise ValueError(
                f"got {len(trajectories)} trajectories but {len(advantages)} advantages"
            )
        return cls(
            [
                TrainSample.from_trajectory(t, a)
                for t, a in zip(trajectories, advantages, strict=True)
            ]
        )

    def set_logprobs(self, field: str, logprobs: Sequence[Sequence[float] | Any]) -> None:
        """Fill ``old_logprobs`` or ``ref_logprobs`` from a trainer's ``compute_logprobs``.

        Values outside each sample's loss mask are zeroed (the token convention), so the full
        per-token output of ``compute_logprobs`` can be passed as it is.
        """
        if field not in ("old_logprobs", "ref_logprobs"):
            raise ValueError(f"field must be 'old_logprobs' or 'ref_logprobs', got {field!r}")
        if len(logprobs) != len(self.samples):
            raise ValueError(f"got {len(logprobs)} logprob rows for {len(self.samples)} samples")
        for sample, row in zip(self.samples, logprobs, strict=True):
            values = row.tolist() if hasattr(row, "tolist") else list(row)
            if len(values) != sample.num_tokens:
                raise ValueError(
                    f"sample {sample.sample_id!r}: {len(values)} logprobs for "
                    f"{sample.num_tokens} tokens"
                )
            masked = [float(v) if m else 0.0 for v, m in zip(values, sample.loss_mask, strict=True)]
            sample._check_logprobs(f"sample {sample.sample_id!r}", field, masked)
            setattr(sample, field, masked)

    def require_loss_tokens(self) -> None:
        """Raise ``ValueError`` when the batch is empty or no sample has a loss token."""
        if not self.samples:
            raise ValueError("the batch has no samples; nothing to train on")
        if self.num_loss_tokens == 0:
            raise ValueError(
                f"none of the {len(self.samples)} samples has a token with loss_mask 1; "
                "nothing to train on (were the completions empty or all masked?)"
            )
