"""Two evaluations of a team on the same problems, compared problem by problem.

On 100 problems a team vote of 0.15 → 0.18 can be 3 problems gained, or 11 gained and 8 lost:
the accuracies alone do not say whether training changed anything. `paired_votes` pairs two
evaluations by problem id (`satseq eval --against DIR`): the problems each got right alone, and
McNemar's exact p-value (`satseq.algo.eval_metrics.sign_test_p_value`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from satseq.algo.eval_metrics import paired_difference_interval, sign_test_p_value
from satseq.evaluation.checkpoints import CheckpointError
from satseq.evaluation.outputs import PREDICTIONS


@dataclass(frozen=True)
class PairedVotes:
    """The team vote of `before` and `after` on the same `num_problems` problems."""

    before: str  # the eval output directory compared against
    num_problems: int
    accuracy_before: float
    accuracy_after: float
    gained: int  # problems the vote gets right after, not before
    lost: int  # problems the vote got right before, not after
    p_value: float  # McNemar's exact test, two-sided

    def as_record(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"team vote {self.accuracy_before:.3f} → {self.accuracy_after:.3f} on "
            f"{self.num_problems} problems: {self.gained} gained, {self.lost} lost "
            f"(McNemar exact p = {self.p_value:.3g}; against {self.before})"
        )


@dataclass(frozen=True)
class PooledVotes:
    """Several paired evaluations (one per seed) taken together: every (seed, problem) pair is
    a unit; the pooled sign test is McNemar's on the summed counts, and the interval is that of
    the pooled accuracy difference (gained − lost)/Σn."""

    runs: list[PairedVotes]

    @property
    def gained(self) -> int:
        return sum(run.gained for run in self.runs)

    @property
    def lost(self) -> int:
        return sum(run.lost for run in self.runs)

    @property
    def num_problems(self) -> int:
        return sum(run.num_problems for run in self.runs)

    @property
    def difference(self) -> float:
        return (self.gained - self.lost) / self.num_problems

    @property
    def p_value(self) -> float:
        return sign_test_p_value(self.gained, self.lost)

    @property
    def interval(self) -> tuple[float, float]:
        """The 95 % interval of the pooled accuracy difference."""
        return paired_difference_interval(self.gained, self.lost, self.num_problems)

    def describe(self) -> str:
        low, high = self.interval
        return (
            f"pooled over {len(self.runs)}: {self.difference:+.3f} [{low:+.3f}, {high:+.3f}] on "
            f"{self.num_problems} pairs, {self.gained} gained, {self.lost} lost "
            f"(McNemar exact p = {self.p_value:.3g})"
        )


def paired_votes(before: dict[str, bool], after: dict[str, bool], label: str) -> PairedVotes:
    """problem id → vote correct, before (from `label`) and after, on the same problems."""
    require_same_problems(before, after.keys(), label)
    gained = sum(after[i] and not before[i] for i in before)
    lost = sum(before[i] and not after[i] for i in before)
    return PairedVotes(
        before=label,
        num_problems=len(before),
        accuracy_before=sum(before.values()) / len(before),
        accuracy_after=sum(after.values()) / len(after),
        gained=gained,
        lost=lost,
        p_value=sign_test_p_value(gained, lost),
    )


def require_same_problems(before: dict[str, bool], after_ids: Iterable[str], label: str) -> None:
    """A `CheckpointError` naming `label` (where `before` came from) unless both evaluations
    hold the same problems (the same dataset)."""
    after = set(after_ids)
    only_before, only_after = before.keys() - after, after - before.keys()
    if only_before or only_after:
        raise CheckpointError(
            f"{label} holds other problems than this evaluation: {len(only_before)} only there "
            f"(e.g. {sorted(only_before)[:3]}), {len(only_after)} only here "
            f"(e.g. {sorted(only_after)[:3]}); compare evaluations of the same dataset"
        )


def read_team_votes(eval_dir: str | Path) -> dict[str, bool]:
    """problem id → is the team vote correct, from `satseq eval`'s predictions.jsonl in
    `eval_dir`; a missing or empty file, a line that is not a record with "problem_id" and
    "correct", or a repeated id is a `CheckpointError` naming the file (and the line)."""
    path = Path(eval_dir) / PREDICTIONS
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist: give the --output-dir of a `satseq eval`")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        message = f"{path} is not UTF-8 text ({err.reason} at byte {err.start})"
        raise CheckpointError(message) from None
    correct: dict[str, bool] = {}
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            problem_id, is_correct = str(record["problem_id"]), record["correct"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise CheckpointError(
                f"{path}:{line_number}: not a prediction record with 'problem_id' and 'correct'"
            ) from None
        if not isinstance(is_correct, bool):
            raise CheckpointError(f"{path}:{line_number}: 'correct' is {is_correct!r}, not a bool")
        if problem_id in correct:
            raise CheckpointError(f"{path}:{line_number}: problem {problem_id!r} appears twice")
        correct[problem_id] = is_correct
    if not correct:
        raise CheckpointError(f"{path} holds no predictions")
    return correct
