"""Token-level trajectory assembly: engine ids and logprobs for sampled spans, masked ids for
everything else, a prefix check on every engine prompt, and drift handling (mask or split).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from vime.types import Message, Status, Trajectory

DriftPolicy = Literal["mask", "split"]
DRIFT_POLICIES: tuple[str, ...] = ("mask", "split")


@dataclass
class _Segment:
    """One contiguous training sample under construction."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    prompt_length: int = 0
    turn_versions: list[int] = field(default_factory=list)

    def extend(self, ids: Sequence[int], logprobs: Sequence[float] | None, version: int) -> None:
        sampled = logprobs is not None
        self.ids.extend(ids)
        self.mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if sampled else [0.0] * len(ids))
        self.versions.extend([version if sampled else -1] * len(ids))


class TrajectoryBuilder:
    """Accumulates one episode's ids, turn by turn, exactly as the engine saw and sampled them.

    Call :meth:`observe_prompt` with the engine's prompt ids before each completion (or
    :meth:`extend_env` with rendered env ids in token-in mode), then :meth:`add_completion`.
    When an engine prompt does not extend the ids so far, the chat template or the
    re-tokenisation of earlier text drifted: with ``drift="mask"`` the sampled ids from the
    point of divergence on lose their loss mask and the engine's prompt replaces them; with
    ``drift="split"`` the ids so far become a finished sample and a new one starts.
    """

    def __init__(self, drift: DriftPolicy = "mask") -> None:
        if drift not in DRIFT_POLICIES:
            raise ValueError(f"drift policy must be one of {DRIFT_POLICIES}, got {drift!r}")
        self.drift = drift
        self._done: list[_Segment] = []
        self._seg = _Segment()
        self.drift_count = 0
        self.drift_masked_tokens = 0
        self.drift_at: list[int] = []  # where mask-mode drifts replaced ids, for viewers
        self.num_turns = 0

    @property
    def ids(self) -> list[int]:
        """The ids accumulated in the current sample (what the next prompt must start with)."""
        return self._seg.ids

    @property
    def last_completion(self) -> list[int]:
        """Ids of the latest sampled turn of the current sample (empty before the first)."""
        seg = self._seg
        end = len(seg.mask)
        start = end
        while start > 0 and seg.mask[start - 1] == 1:
            start -= 1
        return seg.ids[start:end] if end and seg.mask[-1] == 1 else []

    def observe_prompt(self, prompt_ids: Sequence[int]) -> bool:
        """Record the engine's full prompt for the next turn; return False if it drifted."""
        seg = self._seg
        prompt_ids = list(prompt_ids)
        if not seg.ids:
            seg.extend(prompt_ids, None, -1)
            seg.prompt_length = len(prompt_ids)
            return True
        n = len(seg.ids)
        if prompt_ids[:n] == seg.ids:
            seg.extend(prompt_ids[n:], None, -1)
            return True
        self.drift_count += 1
        if self.drift == "split":
            self._done.append(seg)
            self._seg = _Segment()
            self._seg.extend(prompt_ids, None, -1)
            self._seg.prompt_length = len(prompt_ids)
            return False
        keep = _common_prefix(seg.ids, prompt_ids)
        self.drift_masked_tokens += sum(seg.mask[keep:])
        self.drift_at = [p for p in self.drift_at if p < keep] + [keep]
        del seg.ids[keep:], seg.mask[keep:], seg.logprobs[keep:], seg.versions[keep:]
        seg.extend(prompt_ids[keep:], None, -1)
        seg.prompt_length = min(seg.prompt_length, keep)
        return False

    def extend_env(self, ids: Sequence[int]) -> None:
        """Append env/tool/template ids (loss mask 0) rendered by the caller."""
        if not self._seg.ids:
            self._seg.prompt_length = len(ids)
        self._seg.extend(list(ids), None, -1)

    def add_untracked_turn(self) -> None:
        """Count a turn sampled without token ids (an API that returns text only)."""
        self.num_turns += 1

    def add_completion(
        self,
        ids: Sequence[int],
        logprobs: Sequence[float],
        weight_version: int | None,
        version_spans: Sequence[tuple[int | None, int, int]] = (),
    ) -> None:
        """Append one sampled turn: the engine's ids with their logprobs (loss mask 1).

        ``version_spans`` are the engine's ``(version, start, end)`` ranges over ``ids`` when a
        weight update landed mid-generation; they set the per-token versions.
        """
        if not self._seg.ids:
            raise ValueError("add_completion before any prompt: call observe_prompt first")
        if len(ids) != len(logprobs):
            raise ValueError(
                f"engine returned {len(ids)} completion ids but {len(logprobs)} logprobs; "
                "request logprobs for every sampled token"
            )
        bad = [lp for lp in logprobs if not (math.isfinite(lp) and lp <= 0.0)]
        if bad:
            raise ValueError(f"engine logprobs must be finite and <= 0, got {bad[:3]}")
        version = -1 if weight_version is None else int(weight_version)
        self._seg.extend(list(ids), [float(x) for x in logprobs], version)
        if version_spans:
            first = len(self._seg.versions) - len(ids)
            for span_version, start, end in version_spans:
                v = -1 if span_version is None else int(span_version)
                self._seg.versions[first + start : first + end] = [v] * (end - start)
            version = max(self._seg.versions[first:], default=version)
        self._seg.turn_versions.append(version)
        self.num_turns += 1

    def build(
        self,
        *,
        messages: list[Message],
        reward: float,
        turn_rewards: list[float],
        status: Status,
        task_id: str = "",
        sample_index: int = 0,
        error: str | None = None,
        metrics: dict[str, float] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Trajectory:
        """The finished trajectory; earlier samples of a split episode go into
        ``metadata["segments"]`` (see :func:`training_samples`), and the token indices from
        which a masked drift replaced the ids into ``metadata["drift_at"]``."""
        metrics = {
            **(metrics or {}),
            "num_turns": float(self.num_turns),
            "drift_count": float(self.drift_count),
            "drift_masked_tokens": float(self.drift_masked_tokens),
        }
        common: dict[str, Any] = dict(
            reward=reward,
            turn_rewards=list(turn_rewards),
            status=status,
            task_id=task_id,
            sample_index=sample_index,
            error=error,
        )
        earlier = [
            _to_trajectory(s, messages=[], metrics={}, metadata={"segment": i}, **common).to_dict()
            for i, s in enumerate(self._done)
        ]
        meta = dict(metadata or {})
        if self.drift_at:
            meta["drift_at"] = list(self.drift_at)
        if earlier:
            meta["segments"] = earlier
            meta["segment"] = len(earlier)
        return _to_trajectory(
            self._seg, messages=messages, metrics=metrics, metadata=meta, **common
        )


def training_samples(trajectory: Trajectory) -> list[Trajectory]:
    """Every training sample of an episode: the earlier segments of a split, then itself."""
    earlier = [Trajectory.from_dict(d) for d in trajectory.metadata.get("segments", [])]
    return [*earlier, trajectory]


def _to_trajectory(seg: _Segment, **kwargs: Any) -> Trajectory:
    return Trajectory(
        token_ids=list(seg.ids),
        loss_mask=list(seg.mask),
        logprobs=list(seg.logprobs),
        prompt_length=seg.prompt_length,
        weight_versions=list(seg.turn_versions),
        token_versions=list(seg.versions),
        **kwargs,
    )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
