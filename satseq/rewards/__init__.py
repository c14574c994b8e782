"""Rewards: answer extraction, math-verify verification, format rules and custom functions.

Training and evaluation code use `RewardScorer`; the rest is exported for tests and tools.

    scorer = RewardScorer(fallbacks=("answer_is",), timeout_s=5.0)
    scorer.score(prompt, "... so \\\\boxed{\\\\frac{1}{2}}", "0.5")           # 1.0
    batch = scorer.score_batch(prompts, responses, ground_truths)
    batch.scores, batch.n_timeout, batch.n_failed
    scorer.answers_equivalent("x \\\\le 3", "(-\\\\infty, 3]")                 # True, for voting
"""

from satseq.rewards.errors import (
    HelperProcessError,
    HelperStartError,
    RewardError,
    RewardFunctionError,
    RewardFunctionImportError,
    ScoringTimeout,
)
from satseq.rewards.extract import DEFAULT_FALLBACKS, FALLBACKS, extract_answer, last_boxed
from satseq.rewards.format_rules import follows_think_format
from satseq.rewards.scorer import BatchScores, RewardScorer, SampleStatus

__all__ = [
    "DEFAULT_FALLBACKS",
    "FALLBACKS",
    "BatchScores",
    "HelperProcessError",
    "HelperStartError",
    "RewardError",
    "RewardFunctionError",
    "RewardFunctionImportError",
    "RewardScorer",
    "SampleStatus",
    "ScoringTimeout",
    "extract_answer",
    "follows_think_format",
    "last_boxed",
]
