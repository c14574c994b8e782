"""The record types every data source produces, and the one error type of `satseq.data`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


class DataError(ValueError):
    """A problem with input data or data options, worded for the user: what, where, what to do."""


@dataclass(frozen=True)
class MathProblem:
    """One math problem with a verifiable answer.

    `problem` is always the raw problem text, without any instruction wrapper: the SPO value
    tracker and the offline-value files key on it, so it must not change with the prompt format.
    `answer` is the reference answer as text (what the reward compares against).
    `solution` is a worked solution ending in `\\boxed{answer}`, when the source has one.
    `meta` holds whatever else the source row carried (subject, level, difficulty, ...).
    """

    problem_id: str
    problem: str
    answer: str
    solution: str | None = None
    # A dict is unhashable, so it is left out of the hash (it still takes part in ==).
    meta: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class LoadedProblems:
    """What `load_problems` returns: the problems, and the rows it skipped (with the reason).

    Iterating and `len()` go over `problems`, so it can be used where a list is expected.
    """

    source: str
    format_name: str
    problems: list[MathProblem]
    # One message per skipped row, e.g. "data/train.jsonl:17: missing field 'answer' (...)".
    skipped_rows: list[str] = field(default_factory=list)

    @property
    def num_skipped(self) -> int:
        return len(self.skipped_rows)

    def __len__(self) -> int:
        return len(self.problems)

    def __iter__(self) -> Iterator[MathProblem]:
        return iter(self.problems)
