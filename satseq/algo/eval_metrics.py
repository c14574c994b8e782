"""Evaluation metrics over k samples per problem: pass@k, avg@k, maj@k and the majority vote."""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
    answers: Sequence[str | None], equivalent: Callable[[str, str], bool]
) -> tuple[str | None, dict[str, int]]:
    """Cluster ``answers`` by ``equivalent`` and return (winner, votes).

    Each cluster is represented by its first answer in input order; an answer joins the first
    cluster whose representative it is ``equivalent(representative, answer)`` to, else starts
    a new one. None and blank answers cast no vote. A tie goes to the cluster that reached the
    winning count first in input order.

    Returns:
        winner: the winning representative, or None when no answer voted.
        votes: cluster size per representative, in order of first appearance.
    """
    votes: dict[str, int] = {}
    winner, winner_votes = None, 0
    for answer in answers:
        if answer is None or not answer.strip():
            continue
        representative = next((rep for rep in votes if equivalent(rep, answer)), answer)
        votes[representative] = votes.get(representative, 0) + 1
        if votes[representative] > winner_votes:
            winner, winner_votes = representative, votes[representative]
    return winner, votes


def maj_at_k(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    equivalent: Callable[[str, str], bool],
) -> float:
    """maj@k: 1.0 iff the majority-voted answer of the k samples is correct, else 0.0.

    ``correct[j]`` says whether ``answers[j]`` is right; the winner is judged by its
    representative (its first answer). No valid answer scores 0.0.
    """
    if len(answers) != len(correct):
        raise ValueError(f"maj@k: {len(answers)} answers but {len(correct)} correctness flags")
    winner, _ = majority_vote(answers, equivalent)
    if winner is None:
        return 0.0
    return float(bool(correct[answers.index(winner)]))
