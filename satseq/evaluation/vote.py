"""The team's answer: a majority vote over every extracted answer of every agent (design §7).

Answers are clustered by math-verify equivalence (`RewardScorer.answers_equivalent`), not by
string equality. A tie in votes goes to the cluster whose samples have the highest total
log-probability (the sum of `Generation.logprob` over the cluster's samples, under each
sample's own agent, at temperature 1); a tie that remains goes to the cluster that reached the
winning count first. Without log-probabilities (an engine that reports none), only that last
rule applies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from satseq.algo.eval_metrics import majority_vote


@dataclass(frozen=True)
class TeamVote:
    """answer: the winning representative, or None when no sample had an answer.
    votes: cluster size per representative. agreement: the winner's share of the votes cast
    (0.0 when none were)."""

    answer: str | None
    votes: dict[str, int]
    agreement: float


def team_vote(
    answers: Sequence[str | None],
    logprobs: Sequence[float | None],
    equivalent: Callable[[str, str], bool],
) -> TeamVote:
    """Vote over `answers` (any number of samples, any agents), ties broken by `logprobs`."""
    scores = None if any(lp is None for lp in logprobs) else list(logprobs)
    answer, votes = majority_vote(answers, equivalent, scores)
    cast = sum(votes.values())
    return TeamVote(answer, votes, votes[answer] / cast if cast else 0.0)
