"""Evaluation metrics over k samples per problem: pass@k, avg@k, maj@k and the majority vote;
and the sign test and interval that compare two evaluations of the same problems."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, eq. 1).

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i); the product
    form avoids the huge binomials.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))  # Chen et al. eq. 1


def avg_at_k(correct: Sequence[bool]) -> float:
    """avg@k: the mean accuracy over the k samples."""
    if not correct:
        raise ValueError("avg@k needs at least one sample")
    return sum(bool(c) for c in correct) / len(correct)


def majority_vote(
    answers: Sequence[str | None],
    equivalent: Callable[[str, str], bool],
    scores: Sequence[float] | None = None,
) -> tuple[str | None, dict[str, int]]:
    """Cluster ``answers`` by ``equivalent`` and return (winner, votes).

    Each cluster is represented by its first answer in input order; an answer joins the first
    cluster whose representative it is ``equivalent(representative, answer)`` to, else starts
    a new one. None and blank answers cast no vote.

    Ties in the number of votes go to the cluster with the highest total score (the sum of
    ``scores`` over its answers, e.g. the samples' log-probabilities) when ``scores`` is given;
    a tie that remains goes to the cluster that reached the winning count first in input order.

    ``equivalent`` is asked once per distinct pair of strings (samples often repeat an answer
    word for word, and math-verify is slow), so it must be a function of its arguments.

    Returns:
        winner: the winning representative, or None when no answer voted.
        votes: cluster size per representative, in order of first appearance.
    """
    if scores is not None and len(scores) != len(answers):
        raise ValueError(f"majority vote: {len(answers)} answers but {len(scores)} scores")
    equivalent = functools.cache(equivalent)
    votes: dict[str, int] = {}
    total_score: dict[str, float] = {}
    reached_count_at: dict[str, int] = {}  # input index of the cluster's latest vote
    for index, answer in enumerate(answers):
        if answer is None or not answer.strip():
            continue
        representative = next((rep for rep in votes if equivalent(rep, answer)), answer)
        votes[representative] = votes.get(representative, 0) + 1
        total_score[representative] = total_score.get(representative, 0.0) + (
            scores[index] if scores is not None else 0.0
        )
        reached_count_at[representative] = index
    if not votes:
        return None, votes
    most = max(votes.values())
    tied = [rep for rep, count in votes.items() if count == most]
    winner = min(tied, key=lambda rep: (-total_score[rep], reached_count_at[rep]))
    return winner, votes


def maj_at_k(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    equivalent: Callable[[str, str], bool],
    scores: Sequence[float] | None = None,
) -> float:
    """maj@k: 1.0 iff the majority-voted answer of the k samples is correct, else 0.0.

    ``correct[j]`` says whether ``answers[j]`` is right; the winner is judged by its
    representative (its first answer). No valid answer scores 0.0. ``scores`` break ties as
    in `majority_vote`.
    """
    if len(answers) != len(correct):
        raise ValueError(f"maj@k: {len(answers)} answers but {len(correct)} correctness flags")
    winner, _ = majority_vote(answers, equivalent, scores)
    if winner is None:
        return 0.0
    return float(bool(correct[answers.index(winner)]))


def sign_test_p_value(gained: int, lost: int) -> float:
    """McNemar's exact test of two evaluations on the same problems: the two-sided p-value of
    `gained` problems right only in the second and `lost` right only in the first, under "each
    discordant problem is equally likely to go either way" (Binomial(gained + lost, 1/2)).

    p = min(1, 2 · P[X ≤ min(gained, lost)]), X ~ Binomial(gained + lost, 1/2); 1.0 with no
    discordant problem. Exact in integers (`math.comb`), so large counts do not underflow.
    """
    if gained < 0 or lost < 0:
        raise ValueError(f"sign test needs counts >= 0, got gained={gained}, lost={lost}")
    n = gained + lost
    tail = sum(math.comb(n, x) for x in range(min(gained, lost) + 1))
    return min(1.0, float(Fraction(2 * tail, 2**n)))  # McNemar exact, two-sided


def paired_difference_interval(
    gained: int, lost: int, n: int, z: float = 1.959964
) -> tuple[float, float]:
    """The (Wald) confidence interval of the accuracy difference Δ = (gained − lost)/n between
    two evaluations of the same n problems, paired: each problem's difference d ∈ {−1, 0, 1} has
    mean Δ and variance (gained + lost)/n − Δ², so se = sqrt(((g + l)/n − Δ²)/n). z 1.96: 95 %."""
    if n <= 0 or gained < 0 or lost < 0 or gained + lost > n:
        raise ValueError(f"need 0 <= gained + lost <= n, n > 0, got {gained}, {lost}, {n}")
    delta = (gained - lost) / n
    se = math.sqrt(max((gained + lost) / n - delta**2, 0.0) / n)
    return delta - z * se, delta + z * se


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson's score interval of an accuracy p̂ = successes/n (it stays inside [0, 1] and is
    not empty at 0 or n successes): (p̂ + z²/2n ± z·sqrt(p̂(1 − p̂)/n + z²/4n²)) / (1 + z²/n)."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, n > 0, got {successes}, {n}")
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # at 0 or n successes the bound is exactly 0 or 1, which rounding would miss
    return (0.0 if successes == 0 else centre - half), (1.0 if successes == n else centre + half)
