"""Merge `estimate`'s JSONL results into `{prompt: [scores]}`, capped at n0 scores a prompt (§4).

Every row must carry `prompt` (the raw problem text) and `score`; a row that does not stops the
merge with its file:line. What could silently skew the prior is reported instead of hidden:

- a file seen twice (the same bytes under another name) counts once;
- a row that carries a sample identity (`sample_index`, as `estimate` writes) and repeats an
  earlier row exactly counts once; rows without one are never merged, since 8 samples of a
  prompt with the same score are 8 observations, not one;
- prompts found in more than one file (subsets should not overlap) pool their scores;
- a prompt whose rows give different reference answers (the same problem text asked twice);
- with a dataset, its prompts that have no scores (they will get the 0.5/0.5 prior).
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from satseq.data import DataError, load_problems
from satseq.data.loaders import read_rows
from satseq.offline.layout import DEFAULT_RESULTS_PATTERN, natural_key
from satseq.offline.values import is_score, preview, write_offline_values

EXAMPLES_SHOWN = 5  # how many prompts a report line names before it says "and N more"


@dataclass
class MergeReport:
    """What `merge_offline_values` read, wrote, and found wrong, for the user to judge."""

    files: list[Path]
    num_rows: int
    values: dict[str, list[float]]  # as written: at most max_scores_per_prompt scores each
    max_scores_per_prompt: int
    num_subsampled: int  # prompts that had more scores than the cap
    # (location of the repeat, location of the first) for each row or file seen before
    duplicate_rows: list[tuple[str, str]] = field(default_factory=list)
    duplicate_files: list[tuple[Path, Path]] = field(default_factory=list)
    files_of_shared_prompts: dict[str, list[Path]] = field(default_factory=dict)
    conflicting_answers: dict[str, list[str]] = field(default_factory=dict)
    missing_prompts: list[str] | None = None  # dataset prompts with no scores (None: no dataset)
    num_unknown_prompts: int | None = None  # merged prompts the dataset does not have

    def summary_lines(self) -> list[str]:
        counts = [len(scores) for scores in self.values.values()]
        scores = [score for kept in self.values.values() for score in kept]
        lines = [
            f"files: {len(self.files)}",
            f"rows: {self.num_rows}",
            f"prompts: {len(self.values)}",
            f"scores per prompt: min {min(counts)}, mean {statistics.fmean(counts):.2f}, "
            f"max {max(counts)} (cap {self.max_scores_per_prompt}; {self.num_subsampled} "
            "prompts subsampled to it)",
            f"mean score: {statistics.fmean(scores):.4f}",
        ]
        return lines + self.warning_lines()

    def warning_lines(self) -> list[str]:
        lines = []
        if self.duplicate_files:
            repeat, first = self.duplicate_files[0]
            lines.append(
                f"duplicate files: {len(self.duplicate_files)}, counted once (the first: "
                f"{repeat} repeats {first})"
            )
        if self.duplicate_rows:
            repeat, first = self.duplicate_rows[0]
            lines.append(
                f"duplicate rows: {len(self.duplicate_rows)}, counted once (the first: {repeat} "
                f"repeats {first})"
            )
        if self.files_of_shared_prompts:
            prompt, files = next(iter(self.files_of_shared_prompts.items()))
            lines.append(
                f"prompts in more than one file: {len(self.files_of_shared_prompts)}, scores "
                f"pooled (e.g. {preview(prompt)} in {', '.join(map(str, files))})"
            )
        if self.conflicting_answers:
            prompt, answers = next(iter(self.conflicting_answers.items()))
            lines.append(
                f"prompts with conflicting answers: {len(self.conflicting_answers)}, scores "
                f"pooled (e.g. {preview(prompt)}: answers {', '.join(map(repr, answers))})"
            )
        if self.missing_prompts:
            shown = ", ".join(preview(p) for p in self.missing_prompts[:EXAMPLES_SHOWN])
            more = len(self.missing_prompts) - EXAMPLES_SHOWN
            lines.append(
                f"dataset prompts with no offline scores: {len(self.missing_prompts)} (they get "
                f"the 0.5/0.5 prior): {shown}" + (f" and {more} more" if more > 0 else "")
            )
        if self.num_unknown_prompts:
            lines.append(f"merged prompts not in the dataset: {self.num_unknown_prompts}")
        return lines


def merge_offline_values(
    input_dir: str | Path,
    output_file: str | Path,
    pattern: str = DEFAULT_RESULTS_PATTERN,
    max_scores_per_prompt: int = 8,
    seed: int = 0,
    dataset: str | Path | None = None,
    dataset_split: str = "train",
    field_map: Mapping[str, str] | None = None,
    skip_bad_rows: bool = False,
) -> MergeReport:
    """Merge the JSONL files matching `input_dir/pattern` into `output_file`; see the module.

    A prompt with more than `max_scores_per_prompt` scores keeps a random subset of them, drawn
    with `seed`. With `dataset` (read by `load_problems` with `dataset_split`, `field_map` and
    `skip_bad_rows`), the report lists its prompts that got no scores.
    """
    if max_scores_per_prompt < 1:
        raise DataError(f"max_scores_per_prompt must be >= 1, got {max_scores_per_prompt}")
    files = sorted(Path(input_dir).glob(pattern), key=natural_key)
    if not files:
        raise DataError(
            f"no files match {Path(input_dir) / pattern}; run `satseq offline-values estimate` "
            "for each subset first, or pass --pattern"
        )
    report = MergeReport(files, 0, {}, max_scores_per_prompt, 0)
    scores_of: dict[str, list[float]] = defaultdict(list)
    files_of: dict[str, list[Path]] = defaultdict(list)
    answers_of: dict[str, list[str]] = defaultdict(list)
    first_location: dict[bytes, str] = {}
    first_file: dict[bytes, Path] = {}
    for file in files:
        file_digest = hashlib.blake2b(file.read_bytes()).digest()
        if file_digest in first_file:
            report.duplicate_files.append((file, first_file[file_digest]))
            continue
        first_file[file_digest] = file
        for row in read_rows(file):
            report.num_rows += 1
            prompt, score = _prompt_and_score(row.location, row.fields, row.read_error)
            if "sample_index" in row.fields:  # a sample with an identity: a repeat is a copy
                # A digest, not the row: rows carry whole responses and there may be 100k.
                digest = hashlib.blake2b(json.dumps(row.fields, sort_keys=True).encode()).digest()
                if digest in first_location:
                    report.duplicate_rows.append((row.location, first_location[digest]))
                    continue
                first_location[digest] = row.location
            scores_of[prompt].append(score)
            if file not in files_of[prompt]:
                files_of[prompt].append(file)
            answer = row.fields.get("answer")
            if answer is not None and str(answer) not in answers_of[prompt]:
                answers_of[prompt].append(str(answer))
    if not scores_of:
        raise DataError(f"no rows in {', '.join(map(str, files))}: nothing to merge")
    rng = random.Random(seed)
    for prompt, scores in scores_of.items():  # first-seen order: the same files draw alike
        if len(scores) > max_scores_per_prompt:
            report.num_subsampled += 1
            scores = rng.sample(scores, max_scores_per_prompt)
        report.values[prompt] = scores
    report.files_of_shared_prompts = {p: fs for p, fs in files_of.items() if len(fs) > 1}
    report.conflicting_answers = {p: a for p, a in answers_of.items() if len(a) > 1}
    if dataset is not None:
        problems = load_problems(dataset, dataset_split, field_map, skip_bad_rows).problems
        _compare_with_dataset(report, problems)
    write_offline_values(report.values, output_file)
    return report


def _compare_with_dataset(report: MergeReport, problems) -> None:
    """The dataset's prompts that got no scores, and how many scored prompts it lacks."""
    dataset_prompts = dict.fromkeys(problem.problem for problem in problems)
    report.missing_prompts = [p for p in dataset_prompts if p not in report.values]
    report.num_unknown_prompts = sum(p not in dataset_prompts for p in report.values)


def _prompt_and_score(location: str, fields, read_error: str | None) -> tuple[str, float]:
    if fields is None:
        raise DataError(f"{location}: {read_error}")
    prompt, score = fields.get("prompt"), fields.get("score")
    if not isinstance(prompt, str) or not prompt.strip():
        hint = (
            " (a row of the seeds' eval has only the rendered `input`; re-run "
            "`satseq offline-values estimate`, which writes the raw problem text)"
            if "input" in fields
            else ""
        )
        raise DataError(f"{location}: needs a non-empty text field 'prompt'{hint}")
    if not is_score(score):
        raise DataError(f"{location}: 'score' is {json.dumps(score)[:60]}, not a finite number")
    return prompt, float(score)
