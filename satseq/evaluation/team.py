"""Scoring a team on problems: K samples per agent, the team vote, pass@k, avg@k and maj@k.

`evaluate_team` is the one evaluation routine: `satseq eval` calls it with rollout actors
behind `generate`, and training validation calls it with the coordinator's own.

Definitions, per problem, with A agents and K samples each (n = A·K samples):
- `pass_at_k`: the unbiased pass@K over the team's n samples (Chen et al. 2021);
- `avg_at_k`: the fraction of the n samples that are correct;
- `correct`: the team vote (`satseq.evaluation.vote`) is correct; its mean is maj@k, the
  team-vote accuracy;
- per agent: `accuracy` is how often the agent's own vote over its K samples is correct (the
  agent answering alone, comparable with the team vote), `avg@k` its samples' accuracy.
A sample is correct when the scorer gives it a reward > 0.5; a vote is correct when the
sample that represents the winning cluster is.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from satseq.actors.trajectory import GenerateFn, SamplingSpec
from satseq.algo.eval_metrics import avg_at_k, pass_at_k
from satseq.data import MathProblem, PromptFormat, prompt_ids
from satseq.evaluation.vote import team_vote
from satseq.rewards import RewardScorer


@dataclass(frozen=True)
class ProblemResult:
    """One problem's line of predictions.jsonl (`as_record`)."""

    problem_id: str
    prompt: str  # the problem text as asked (before the chat template)
    ground_truth: str
    predicted_answer: str | None
    individual_answers: dict[str, list[str | None]]  # agent → its K extracted answers
    individual_correct: dict[str, list[bool]]
    votes: dict[str, int]
    agreement: float
    correct: bool
    pass_at_k: float
    avg_at_k: float
    agent_correct: dict[str, bool]  # agent → is its own vote over its K samples correct
    # agent → each of its K samples' sandbox runs (all 0 without tools)
    tool_calls: dict[str, list[int]] = field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        return {
            "problem_id": self.problem_id,
            "prompt": self.prompt,
            "ground_truth": self.ground_truth,
            "predicted_answer": self.predicted_answer,
            "individual_answers": self.individual_answers,
            "individual_correct": self.individual_correct,
            "votes": self.votes,
            "agreement": self.agreement,
            "correct": self.correct,
            "pass_at_k": self.pass_at_k,
            "avg_at_k": self.avg_at_k,
        }


@dataclass(frozen=True)
class TeamEvaluation:
    """Per-problem results and their summary (the content of summary.json)."""

    results: list[ProblemResult]
    agent_names: list[str]
    k: int
    wall_time_s: float

    def summary(self) -> dict[str, Any]:
        team_accuracy = _mean(r.correct for r in self.results)
        per_agent = {
            name: {
                "accuracy": _mean(r.agent_correct[name] for r in self.results),
                "avg@k": _mean(avg_at_k(r.individual_correct[name]) for r in self.results),
                "pass@k": _mean(
                    pass_at_k(self.k, sum(r.individual_correct[name]), self.k) for r in self.results
                ),
            }
            for name in self.agent_names
        }
        best = max(self.agent_names, key=lambda name: per_agent[name]["accuracy"])
        return {
            "num_problems": len(self.results),
            "agents": self.agent_names,
            "samples_per_agent": self.k,
            "pass@k": _mean(r.pass_at_k for r in self.results),
            "avg@k": _mean(r.avg_at_k for r in self.results),
            "maj@k": team_accuracy,
            "team_vote_accuracy": team_accuracy,
            "per_agent": per_agent,
            "best_agent": {"name": best, "accuracy": per_agent[best]["accuracy"]},
            "wall_time_s": self.wall_time_s,
        }

    def metrics(self, prefix: str = "val/") -> dict[str, float]:
        """Flat metrics for metrics.jsonl / TensorBoard: accuracy/team, accuracy/<agent>,
        pass@k, avg@k, maj@k, each under `prefix`."""
        summary = self.summary()
        flat = {f"{prefix}accuracy/team": summary["team_vote_accuracy"]}
        for name, values in summary["per_agent"].items():
            flat[f"{prefix}accuracy/{name}"] = values["accuracy"]
        for key in ("pass@k", "avg@k", "maj@k"):
            flat[f"{prefix}{key}"] = summary[key]
        return flat

    def tool_calls(self) -> list[int]:
        """Every sample's number of sandbox runs (tool-loop samples; 0 for the others)."""
        return [n for r in self.results for name in self.agent_names for n in r.tool_calls[name]]


def evaluate_team(
    problems: Sequence[MathProblem],
    agent_names: Sequence[str],
    generate: GenerateFn,
    tokenizers: Sequence[Any],
    prompt_format: PromptFormat,
    scorer: RewardScorer,
    k: int,
    spec: SamplingSpec,
) -> TeamEvaluation:
    """Score the team on `problems`: every agent draws `k` samples of every problem.

    Args:
        problems: what to ask; `answer` is the ground truth.
        agent_names: the team, in the order of `tokenizers`.
        generate: `(requests, spec) -> samples`, with requests `(agent name, prompt ids, n)`
            and samples[r] the n Generations of requests[r]: `RolloutWorker.generate`, or a
            function that spreads requests over rollout actors. One call is made, with one
            request per (problem, agent).
        tokenizers: tokenizers[i] is agent_names[i]'s (prompts and decoding).
        prompt_format: how a problem is put to the agents (`launch.settings.prompt_format`).
        scorer: rewards (correctness), answer extraction and answer equivalence for the vote.
        k: samples per agent per problem.
        spec: how to sample (eval defaults: T 0.6, top_p 0.95; see `EvalConfig`).
    """
    if not problems:
        raise ValueError("evaluate_team needs at least one problem")
    if len(agent_names) != len(tokenizers) or not agent_names:
        raise ValueError(f"{len(agent_names)} agent names but {len(tokenizers)} tokenizers")
    if k < 1:
        raise ValueError(f"k (samples per agent) must be at least 1, got {k}")
    started = time.perf_counter()
    keys = [(p, a) for p in range(len(problems)) for a in range(len(agent_names))]
    requests = [
        (agent_names[a], prompt_ids(tokenizers[a], problems[p], prompt_format), k) for p, a in keys
    ]
    samples = generate(requests, spec)
    texts = [
        [tokenizers[a].decode(g.token_ids, skip_special_tokens=True) for g in request_samples]
        for (_, a), request_samples in zip(keys, samples, strict=True)
    ]
    flat_texts = [text for request_texts in texts for text in request_texts]
    flat_problems = [problems[p] for p, _ in keys for _ in range(k)]
    rewards = scorer.score_batch(
        [problem.problem for problem in flat_problems],
        flat_texts,
        [problem.answer for problem in flat_problems],
    ).scores
    results = []
    for p, problem in enumerate(problems):
        answers: dict[str, list[str | None]] = {}
        correct: dict[str, list[bool]] = {}
        logprobs: dict[str, list[float | None]] = {}
        tool_calls: dict[str, list[int]] = {}
        for a, name in enumerate(agent_names):
            r = p * len(agent_names) + a
            answers[name] = [scorer.extract_answer(text) for text in texts[r]]
            correct[name] = [rewards[r * k + j] > 0.5 for j in range(k)]
            logprobs[name] = [g.logprob for g in samples[r]]
            tool_calls[name] = [g.meta.get("tool_calls", 0) for g in samples[r]]
        results.append(_problem_result(problem, answers, correct, logprobs, tool_calls, scorer, k))
    return TeamEvaluation(results, list(agent_names), k, time.perf_counter() - started)


def _problem_result(
    problem: MathProblem,
    answers: dict[str, list[str | None]],
    correct: dict[str, list[bool]],
    logprobs: dict[str, list[float | None]],
    tool_calls: dict[str, list[int]],
    scorer: RewardScorer,
    k: int,
) -> ProblemResult:
    all_answers = [answer for name in answers for answer in answers[name]]
    all_correct = [flag for name in answers for flag in correct[name]]
    vote = team_vote(
        all_answers, [lp for name in answers for lp in logprobs[name]], scorer.answers_equivalent
    )
    agent_correct = {}
    for name in answers:
        own = team_vote(answers[name], logprobs[name], scorer.answers_equivalent)
        agent_correct[name] = _vote_correct(own.answer, answers[name], correct[name])
    return ProblemResult(
        problem_id=problem.problem_id,
        prompt=problem.problem,
        ground_truth=problem.answer,
        predicted_answer=vote.answer,
        individual_answers=answers,
        individual_correct=correct,
        votes=vote.votes,
        agreement=vote.agreement,
        correct=_vote_correct(vote.answer, all_answers, all_correct),
        pass_at_k=pass_at_k(len(all_correct), sum(all_correct), k),
        avg_at_k=avg_at_k(all_correct),
        agent_correct=agent_correct,
        tool_calls=tool_calls,
    )


def _vote_correct(winner: str | None, answers: list[str | None], correct: list[bool]) -> bool:
    """Whether the winning representative's own sample is correct (as `maj_at_k` judges)."""
    return winner is not None and correct[answers.index(winner)]


def _mean(values) -> float:
    return float(np.mean(list(values)))
