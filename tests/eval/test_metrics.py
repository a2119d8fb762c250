"""pass@k against brute-force subset enumeration; maj@k, mean reward and CIs on hand-made data."""

import itertools
import math

import pytest

from vime.eval.metrics import (
    ConfidenceInterval,
    bootstrap_ci,
    maj_at_k,
    majority_vote,
    mean_pass_at_k,
    mean_reward,
    pass_at_k,
)


def _pass_at_k_brute_force(n, c, k):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_equals_enumeration_of_all_k_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_brute_force(n, c, k), abs=1e-12)


def test_pass_at_k_hand_computed():
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 3 of the 6 pairs hold the correct one
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 6, 5) == 1.0  # fewer than 5 wrong samples: every 5-subset passes


def test_pass_at_k_is_stable_for_large_n():
    # C(1000, 500) overflows a float; the product form does not
    value = pass_at_k(1000, 3, 500)
    assert value == pytest.approx(1 - (500 * 499 * 498) / (1000 * 999 * 998), abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="need 1 <= k <= n, got k=8 with n=4 samples"):
        pass_at_k(4, 1, 8)
    with pytest.raises(ValueError, match="need 0 <= c <= n, got n=4, c=5"):
        pass_at_k(4, 5, 1)


def test_mean_pass_at_k_weighs_tasks_equally():
    assert mean_pass_at_k([(4, 1), (2, 2)], 1) == pytest.approx((0.25 + 1.0) / 2)
    with pytest.raises(ValueError, match="no tasks"):
        mean_pass_at_k([], 1)


def test_majority_vote_breaks_ties_by_first_appearance():
    assert majority_vote(["7", "3", "3", "7"]) == 0  # tie 2-2: "7" appeared first
    assert majority_vote(["3", "7", "7", "3"]) == 0
    assert majority_vote(["1", "2", "2"]) == 1
    assert majority_vote([None, "5", None]) == 0  # unparsable answers vote "invalid"
    assert majority_vote(["5", None, None]) == 1
    assert majority_vote([None, "5"]) == 0  # tie: "invalid" was seen first


def test_maj_at_k_votes_on_the_first_k_samples():
    answers = ["42", "41", "41", "42", "42"]
    correct = [True, False, False, True, True]
    assert maj_at_k(answers, correct, 1) == 1.0
    assert maj_at_k(answers, correct, 3) == 0.0  # "41" wins 2-1
    assert maj_at_k(answers, correct, 4) == 1.0  # 2-2 tie: "42" appeared first
    assert maj_at_k(answers, correct, 5) == 1.0
    assert maj_at_k([None, None, "1"], [False, False, True], 2) == 0.0


def test_maj_at_k_votes_on_the_env_graders_classes():
    # the example: 3 of 5 answers are right, written three ways
    answers = ["999", "999", "1000", "1000", "1000"]  # Math-v0's answer_key of each sample
    assert maj_at_k(answers, [False, False, True, True, True], 5) == 1.0
    # samples graded right vote together even when an env gives no canonical form
    written = ["999", "999", "1,000", "1000", "x = 1000"]
    assert maj_at_k(written, [False, False, True, True, True], 5) == 1.0


def test_unparsable_answers_vote_invalid_and_can_win():
    assert maj_at_k([None, None, None, "7"], [False, False, False, True], 4) == 0.0
    assert maj_at_k([None, "7", "7"], [False, True, True], 3) == 1.0


def test_maj_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="3 answers but 2 correctness flags"):
        maj_at_k(["1", "2", "3"], [True, False], 2)
    with pytest.raises(ValueError, match=r"need 1 <= k <= 3 samples, got k=4"):
        maj_at_k(["1", "2", "3"], [True, False, True], 4)


def test_mean_reward_averages_task_means():
    assert mean_reward([[1.0, 0.0], [0.5, 0.5, 0.5, 0.5]]) == pytest.approx(0.5)
    assert mean_reward([[1.0], [0.0, 0.0, 0.0]]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="a task has no rewards"):
        mean_reward([[1.0], []])


def test_bootstrap_ci_of_constant_values_is_a_point():
    ci = bootstrap_ci([0.5] * 7)
    assert ci == ConfidenceInterval(0.5, 0.5, 0.5, 0.95)


def test_bootstrap_ci_matches_the_exact_resampling_distribution():
    # values 0, 0, 0, 1: a resample mean is Binomial(4, 1/4) / 4, so
    # P(mean = 0) = 0.316 > 2.5% and P(mean <= 0.5) = 0.949 < 97.5% < P(mean <= 0.75) = 0.996
    ci = bootstrap_ci([0.0, 0.0, 0.0, 1.0], num_resamples=20000, seed=1)
    assert (ci.estimate, ci.low, ci.high) == (0.25, 0.0, 0.75)
    probs = [math.comb(4, j) * 0.25**j * 0.75 ** (4 - j) for j in range(5)]
    assert sum(probs[:3]) < 0.975 < sum(probs[:4])


def test_bootstrap_ci_is_seeded_and_brackets_the_estimate():
    values = [0.1, 0.9, 0.4, 0.7, 0.3, 0.8, 0.2, 0.6]
    a = bootstrap_ci(values, seed=3)
    assert a == bootstrap_ci(values, seed=3)
    assert a.low < a.estimate < a.high
    wider = bootstrap_ci(values, seed=3, confidence=0.99)
    assert wider.low <= a.low and wider.high >= a.high


def test_bootstrap_ci_rejects_bad_arguments():
    with pytest.raises(ValueError, match="no values"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\), got 95"):
        bootstrap_ci([1.0], confidence=95)
