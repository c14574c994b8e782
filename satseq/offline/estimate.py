"""Step 2 of the offline values: n0 samples per problem from the base model, scored (§4).

The problems of one data file are asked in the training prompt format (`data.prompt`), sampled
with the training sampling settings (`rollout`) by real `RolloutActor`s spread over
`rollout.num_actors`, and scored by the training reward (`reward`). With
`rollout.tools.enabled`, the model's code runs in the configured sandbox, as in training.
One JSONL row per sample:

    {"prompt": <raw problem text>, "score": 1.0, "problem_id": ..., "answer": ...,
     "sample_index": 0..n-1, "response": ..., "finish_reason": ..., "response_tokens": ...,
     "status": <the scorer's status>, + the tool loop's "tool_calls", "turns", ...}

`prompt` is the problem text as loaded, the key SPO's tracker uses; it is never parsed back out
of the rendered chat template, which would change with the template.
"""

from __future__ import annotations

import contextlib
import json
import logging
import statistics
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from satseq.config import RunConfig, load_config
from satseq.data import DataError, MathProblem, load_problems, prompt_ids
from satseq.files import write_atomically
from satseq.offline.layout import default_exp_name, results_path
from satseq.seeds import stage_seed

log = logging.getLogger(__name__)

AGENT = "base"  # the one agent of the estimation's rollout actors
ProgressCallback = Callable[[int, int, float], None]
"""Called after each chunk with (prompts done, prompts in all, mean score so far)."""


@dataclass(frozen=True)
class EstimateReport:
    output_file: Path
    num_prompts: int
    num_samples: int  # n0 per prompt
    mean_score: float
    num_always_solved: int  # prompts whose every sample scored > 0.5
    num_never_solved: int  # prompts whose every sample scored <= 0.5
    statuses: dict[str, int]  # the scorer's status -> samples
    skipped_rows: list[str]

    def summary_lines(self) -> list[str]:
        statuses = ", ".join(f"{status} {count}" for status, count in sorted(self.statuses.items()))
        return [
            f"wrote {self.output_file}",
            f"prompts: {self.num_prompts}, samples per prompt: {self.num_samples}",
            f"mean score: {self.mean_score:.4f}",
            f"prompts always solved: {self.num_always_solved}, never solved: "
            f"{self.num_never_solved}",
            f"samples by scorer status: {statuses}",
        ] + [f"skipped: {row}" for row in self.skipped_rows]


def estimate_offline_values(
    data_file: str | Path,
    model_path: str,
    output_dir: str | Path,
    n_samples: int = 8,
    exp_name: str | None = None,
    config: RunConfig | None = None,
    address: str | None = None,
    chunk_size: int = 256,
    on_progress: ProgressCallback | None = None,
) -> EstimateReport:
    """Sample and score `n_samples` responses per problem of `data_file`; see the module.

    Writes `output_dir/<exp_name>/validation_data/0.jsonl` (the seeds' layout); `exp_name`
    defaults to `offline_value_estimation_subset_<i>` for a `subset_<i>` file, else
    `offline_value_estimation`. `config` (default: the embedded quickstart) supplies the
    prompt format, sampling settings, reward and rollout actors; Ray is joined at `address`
    ($RAY_ADDRESS), else started locally. Prompts go to the actors `chunk_size` at a time.
    """
    config = config or load_config()
    if n_samples < 1:
        raise DataError(f"n_samples must be >= 1, got {n_samples}")
    if chunk_size < 1:
        raise DataError(f"chunk_size must be >= 1, got {chunk_size}")
    # Imported here, after the checks: Ray, torch and transformers take seconds to import.
    from satseq.launch.actors import rollout_fleet
    from satseq.launch.connection import ray_session
    from satseq.launch.settings import prompt_format, reward_scorer
    from satseq.models import load_tokenizer, resolve_model_path

    loaded = load_problems(
        data_file, config.data.split, config.data.field_map, config.data.skip_bad_rows
    )
    model_dir = str(resolve_model_path(model_path))
    tokenizer = load_tokenizer(model_dir)
    problem_format = prompt_format(config)
    output_file = results_path(output_dir, exp_name or default_exp_name(data_file))

    scorer = reward_scorer(config)
    scores_of: list[list[float]] = []
    statuses: Counter[str] = Counter()

    # with tools, the model's code runs in the sandbox as it would in training
    with (
        ray_session(address),
        rollout_fleet(config, {AGENT: model_dir}, config.trainer.seed) as fleet,
        contextlib.closing(scorer),
    ):
        prompting = (problem_format, tokenizer)

        def write_rows(rows) -> None:
            sampled = _sampled(fleet, config, loaded.problems, prompting, n_samples, chunk_size)
            for done, (problem, samples) in enumerate(sampled, 1):
                scored = _write_problem_rows(rows, problem, samples, tokenizer, scorer)
                statuses.update(scored.statuses)
                scores_of.append(scored.scores)
                if on_progress and (done % chunk_size == 0 or done == len(loaded.problems)):
                    on_progress(done, len(loaded.problems), _mean(scores_of))

        write_atomically(output_file, write_rows)  # no half-written file if the run dies
    return EstimateReport(
        output_file=output_file,
        num_prompts=len(scores_of),
        num_samples=n_samples,
        mean_score=_mean(scores_of),
        num_always_solved=sum(all(s > 0.5 for s in scores) for scores in scores_of),
        num_never_solved=sum(all(s <= 0.5 for s in scores) for scores in scores_of),
        statuses=dict(statuses),
        skipped_rows=loaded.skipped_rows,
    )


def _sampled(
    fleet, config: RunConfig, problems: list[MathProblem], prompting, n: int, chunk_size: int
) -> Iterator[tuple[MathProblem, list]]:
    """(problem, its n samples) for each problem in order, asked of the fleet `chunk_size`
    problems at a time, chunk c sampled with the seed of "stage" c. prompting: (prompt format,
    tokenizer)."""
    from satseq.launch.settings import sampling_spec

    problem_format, tokenizer = prompting
    for chunk_index, first in enumerate(range(0, len(problems), chunk_size)):
        chunk = problems[first : first + chunk_size]
        spec = sampling_spec(config, seed=stage_seed(config.trainer.seed, chunk_index))
        requests = [(AGENT, prompt_ids(tokenizer, p, problem_format), n) for p in chunk]
        yield from zip(chunk, fleet.generate(requests, spec), strict=True)


def _write_problem_rows(rows, problem: MathProblem, samples: list, tokenizer, scorer):
    """One problem's samples decoded, scored by the training reward and written as JSONL rows;
    returns the scorer's result (scores and statuses)."""
    responses = [tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in samples]
    n = len(samples)
    scored = scorer.score_batch([problem.problem] * n, responses, [problem.answer] * n)
    for index, sample in enumerate(
        zip(samples, responses, scored.scores, scored.statuses, strict=True)
    ):
        row = json.dumps(_row(problem, index, *sample), ensure_ascii=False)
        rows.write(row.encode("utf-8") + b"\n")
    return scored


def _row(
    problem: MathProblem, index: int, generation, response: str, score: float, status: str
) -> dict[str, Any]:
    return {
        **generation.meta,  # tool rollouts: tool_calls, turns, tool_statuses (never the keys below)
        "prompt": problem.problem,
        "score": float(score),
        "problem_id": problem.problem_id,
        "answer": problem.answer,
        "sample_index": index,
        "response": response,
        "finish_reason": generation.finish_reason,
        "response_tokens": len(generation.token_ids),
        "status": status,
    }


def _mean(scores_of: list[list[float]]) -> float:
    return statistics.fmean(score for scores in scores_of for score in scores)
