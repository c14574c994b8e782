"""pass@k against brute-force enumeration; avg@k, maj@k and the majority vote by hand; the sign
test by hand and against scipy's exact binomial test."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats
from hypothesis import given
from hypothesis import strategies as st

from satseq.algo.eval_metrics import (
    avg_at_k,
    maj_at_k,
    majority_vote,
    paired_difference_interval,
    pass_at_k,
    sign_test_p_value,
    wilson_interval,
)


def same_number(a: str, b: str) -> bool:
    """A test-local stand-in for math-verify: "1/2" == "0.5" == "0.50"."""
    return Fraction(a) == Fraction(b)


def brute_force_pass_at_k(n, c, k):
    """The fraction of k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in subset) for subset in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration_over_all_k_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k))


def test_pass_at_k_hand_values():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the accuracy c / n
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k: every subset has a correct sample
    # large n stays finite where the binomials would overflow a float
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 2)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_avg_at_k():
    assert avg_at_k([True, False, True, True]) == 0.75
    assert avg_at_k([False]) == 0.0
    with pytest.raises(ValueError):
        avg_at_k([])


def test_majority_vote_clusters_by_equivalence_not_string_equality():
    answers = ["3", "1/2", "3", "0.5", None, "0.50", "", "  "]
    winner, votes = majority_vote(answers, same_number)
    assert winner == "1/2"
    assert votes == {"3": 2, "1/2": 3}
    # string equality would pick "3"
    assert majority_vote(answers, str.__eq__) == ("3", {"3": 2, "1/2": 1, "0.5": 1, "0.50": 1})


def test_majority_vote_asks_once_per_distinct_pair_of_answers():
    asked = []

    def counted(a: str, b: str) -> bool:
        asked.append((a, b))
        return same_number(a, b)

    answers = ["92", "82", "92", "92", "82", "92", "0.5", "1/2"]
    assert majority_vote(answers, counted) == ("92", {"92": 4, "82": 2, "0.5": 2})
    # (92, 82), (92, 92), (82, 82), then 0.5 and 1/2 against each cluster before them: 8 of
    # the 11 comparisons the vote makes
    assert len(asked) == len(set(asked)) == 8


def test_majority_vote_ties_go_to_the_first_cluster_to_reach_the_max():
    # "2" reaches 2 votes at index 2, "7" only at index 3
    assert majority_vote(["7", "2", "2.0", "7"], same_number) == ("2", {"7": 2, "2": 2})
    assert majority_vote(["7", "2"], same_number)[0] == "7"
    assert majority_vote([None, ""], same_number) == (None, {})


def test_maj_at_k():
    answers = ["3", "1/2", "3", "0.5", "0.50"]
    correct = [False, True, False, True, True]
    assert maj_at_k(answers, correct, same_number) == 1.0
    assert maj_at_k(answers, correct, str.__eq__) == 0.0  # string vote picks the wrong "3"
    assert maj_at_k([None, None], [False, False], same_number) == 0.0
    with pytest.raises(ValueError):
        maj_at_k(["1"], [True, False], same_number)


@pytest.mark.parametrize(
    ("gained", "lost", "p"),
    [
        (0, 0, 1.0),  # no discordant problem: nothing to tell the runs apart
        (3, 3, 1.0),
        (5, 0, 2 / 2**5),  # all 5 one way: 2 · (1/2)^5
        (0, 5, 2 / 2**5),
        (11, 8, 2 * sum(math.comb(19, x) for x in range(9)) / 2**19),  # 0.6476
        (20, 10, 2 * sum(math.comb(30, x) for x in range(11)) / 2**30),  # 0.0987
    ],
)
def test_sign_test_hand_values(gained, lost, p):
    assert sign_test_p_value(gained, lost) == pytest.approx(p, rel=1e-12)


@given(st.integers(0, 400), st.integers(0, 400))
def test_sign_test_is_scipys_exact_binomial_test(gained, lost):
    """An independent reference: scipy's two-sided exact binomial test at 1/2 on the discordant
    problems (its p sums every outcome no likelier than the one seen; symmetric at 1/2)."""
    p = sign_test_p_value(gained, lost)
    assert 0.0 < p <= 1.0 and p == sign_test_p_value(lost, gained)
    if gained + lost:
        reference = scipy.stats.binomtest(gained, gained + lost, 0.5).pvalue
        assert p == pytest.approx(reference, rel=1e-9, abs=1e-300)
    if gained > lost:  # one more problem the same way is stronger evidence
        assert sign_test_p_value(gained + 1, lost) < p


def test_sign_test_rejects_negative_counts():
    with pytest.raises(ValueError, match="counts >= 0"):
        sign_test_p_value(-1, 3)


def test_paired_difference_interval_by_hand():
    # 17 gained, 7 lost of 100: Δ = 0.10, var = 0.24 − 0.01 = 0.23, se = sqrt(0.0023) = 0.04796
    low, high = paired_difference_interval(17, 7, 100)
    se = math.sqrt(0.0023)
    assert (low, high) == pytest.approx((0.10 - 1.959964 * se, 0.10 + 1.959964 * se))
    assert paired_difference_interval(0, 0, 50) == (0.0, 0.0)  # no problem changed
    with pytest.raises(ValueError, match="gained"):
        paired_difference_interval(60, 50, 100)


def test_paired_difference_interval_covers_in_simulation():
    """Problems gained with p 0.12 and lost with p 0.07 (Δ = 0.05), 1,000 problems: the 95 %
    interval covers Δ in about 95 % of 2,000 simulated evaluations."""
    rng = np.random.default_rng(0)
    draws = rng.choice(3, size=(2000, 1000), p=[0.12, 0.07, 0.81])
    covered = 0
    for row in draws:
        low, high = paired_difference_interval(int((row == 0).sum()), int((row == 1).sum()), 1000)
        covered += low <= 0.05 <= high
    assert 0.93 <= covered / 2000 <= 0.97


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [  # by hand: (p̂ + z²/2n ± z·sqrt(p̂(1 − p̂)/n + z²/4n²)) / (1 + z²/n), z = 1.96
        (5, 10, 0.236593, 0.763407),
        (0, 10, 0.0, 0.277533),  # no success: not the empty interval Wald gives
        (10, 10, 0.722467, 1.0),
        (61, 1000, 0.047780, 0.077580),  # centre 0.062681, half-width 0.014900
    ],
)
def test_wilson_interval_by_hand(successes, n, low, high):
    assert wilson_interval(successes, n) == pytest.approx((low, high), abs=1e-6)


@given(st.integers(1, 3000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_interval_is_scipys(counts):
    """An independent reference: scipy's binomial test's Wilson interval (no continuity
    correction)."""
    successes, n = counts
    low, high = wilson_interval(successes, n)
    reference = scipy.stats.binomtest(successes, n).proportion_ci(0.95, method="wilson")
    assert (low, high) == pytest.approx((reference.low, reference.high), abs=1e-6)
    assert 0.0 <= low <= successes / n <= high <= 1.0


def test_wilson_interval_rejects_impossible_counts():
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_interval(11, 10)
