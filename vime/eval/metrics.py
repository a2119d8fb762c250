"""Evaluation metrics: unbiased pass@k, maj@k, mean reward and bootstrap confidence intervals.

Pure Python (numpy only for the bootstrap), so the eval harness and reports can use them
without torch.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

# Resampled indices are drawn in blocks of at most this many entries to bound memory.
_BOOTSTRAP_BLOCK = 1_000_000


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", arXiv:2107.03374).

    ``pass@k = 1 - C(n - c, k) / C(n, k)``, the probability that a random k-subset of the
    n samples holds at least one correct one, computed in the numerically stable product
    form ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` (1.0 when ``n - c < k``).
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(
            f"pass_at_k: need 1 <= k <= n, got k={k} with n={n} samples; sample at least k "
            "responses per task or lower k"
        )
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def is_correct(reward: float, correct: bool | None = None, threshold: float = 1.0) -> bool:
    """Whether one sample counts as correct for pass@k: the env's own ``correct`` flag when
    it reports one, else ``reward >= threshold``. A failed sample is never correct."""
    return bool(correct) if correct is not None else reward >= threshold


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """pass@k averaged over tasks, from one ``(n, c)`` pair per task (each task weighs the
    same, whatever its n)."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise ValueError("mean_pass_at_k: no tasks given")
    return math.fsum(values) / len(values)


_INVALID = ("invalid",)  # the vote of a sample without a valid answer
_RIGHT = ("right",)  # the class of every sample graded correct


def majority_vote(answers: Sequence[Hashable | None]) -> int:
    """Index of the first sample of the answer class that wins a plurality vote.

    Equal answers form one class; ``None`` answers (unparsable, or rejected by the env's
    grader) form one more, "invalid", which votes like any other and can win. Ties go to the
    class seen first, so the result is deterministic and independent of hashing order.
    """
    if not answers:
        raise ValueError("majority_vote: no answers given")
    votes: dict[Hashable, int] = {}
    first: dict[Hashable, int] = {}
    for i, answer in enumerate(answers):
        label = _INVALID if answer is None else ("answer", answer)
        votes[label] = votes.get(label, 0) + 1
        first.setdefault(label, i)
    winner = max(votes, key=lambda a: (votes[a], -first[a]))
    return first[winner]


def maj_at_k(answers: Sequence[Hashable | None], correct: Sequence[bool], k: int) -> float:
    """maj@k of one task: 1.0 if the answer class that wins the vote among the *first* k
    samples is the right one.

    Classes come from the env's own grader: every sample it graded correct (``correct[i]``)
    is equivalent to the gold answer, so all of them vote together, whatever their written
    form (``1,000``, ``1000``, ``x = 1000``). A sample graded wrong votes for its
    ``answers[i]``, the env's canonical form of its answer (Math-v0's ``answer_key``), or for
    "invalid" when that is None (nothing parsable, or an answer the grader rejected). Invalid
    can win, and then maj@k is 0.0. The vote is taken on the first k samples in sample order
    (not an expectation over k-subsets); ties go to the class seen first.
    """
    if len(answers) != len(correct):
        raise ValueError(
            f"maj_at_k: {len(answers)} answers but {len(correct)} correctness flags; "
            "give one of each per sample"
        )
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj_at_k: need 1 <= k <= {len(answers)} samples, got k={k}")
    classes = [
        _RIGHT if right else answer for answer, right in zip(answers[:k], correct[:k], strict=True)
    ]
    return float(bool(correct[majority_vote(classes)]))


def mean_reward(rewards_per_task: Iterable[Sequence[float]]) -> float:
    """Mean reward over tasks of each task's mean over its samples (tasks weigh the same)."""
    means = []
    for rewards in rewards_per_task:
        if not rewards:
            raise ValueError("mean_reward: a task has no rewards; drop it or record its samples")
        means.append(math.fsum(rewards) / len(rewards))
    if not means:
        raise ValueError("mean_reward: no tasks given")
    return math.fsum(means) / len(means)


@dataclass(frozen=True)
class ConfidenceInterval:
    """A point estimate (the mean over tasks) with its bootstrap interval ``[low, high]``."""

    estimate: float
    low: float
    high: float
    confidence: float


def bootstrap_ci(
    values: Sequence[float],
    *,
    confidence: float = 0.95,
    num_resamples: int = 2000,
    seed: int = 0,
) -> ConfidenceInterval:
    """Percentile bootstrap confidence interval of the mean of per-task ``values`` (Efron &
    Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13).

    Tasks are resampled with replacement ``num_resamples`` times (numpy PCG64 seeded by
    ``seed``, so the interval is reproducible); ``low``/``high`` are the ``(1 - confidence)
    / 2`` and ``(1 + confidence) / 2`` quantiles of the resampled means (linear
    interpolation). Pass per-task pass@k, maj@k or mean rewards.
    """
    import numpy as np

    if not values:
        raise ValueError("bootstrap_ci: no values given")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"bootstrap_ci: confidence must be in (0, 1), got {confidence}")
    if num_resamples < 1:
        raise ValueError(f"bootstrap_ci: num_resamples must be >= 1, got {num_resamples}")
    data = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    n = data.shape[0]
    rows = max(1, _BOOTSTRAP_BLOCK // n)
    means = []
    for start in range(0, num_resamples, rows):
        size = min(rows, num_resamples - start)
        means.append(data[rng.integers(0, n, size=(size, n))].mean(axis=1))
    low, high = np.quantile(np.concatenate(means), [(1 - confidence) / 2, (1 + confidence) / 2])
    return ConfidenceInterval(float(data.mean()), float(low), float(high), confidence)
