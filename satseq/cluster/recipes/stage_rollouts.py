"""A stage's rollouts as the recipes plan, generate and correct them: each recipe plans its
prompts and owners (`RolloutPlan`), a `RolloutQueue` generates them now or up to
`rollout.max_staleness` stages ahead, and rollouts an older team generated are corrected by the
truncated off-policy weight (DESIGN §12)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from satseq.actors.trajectory import SamplingSpec, Trajectory
from satseq.algo import truncated_is_weights
from satseq.cluster.rollout_queue import RolloutQueue, StageRollouts
from satseq.cluster.stage_batch import StageBatch
from satseq.config import RunConfig
from satseq.data import MathProblem

if TYPE_CHECKING:
    from satseq.cluster.runtime import TeamRuntime

MAX_LOG_RATIO = 5.0
"""The off-policy weight's log-ratio clamp for GRPO and SPO (SAT-Seq uses sat_seq.max_log_ratio,
whose default this is): the weight never falls below exp(−5)."""


@dataclass(frozen=True)
class RolloutPlan:
    """What a stage's rollouts are: the stage, its problems and how to sample them. `extra`:
    what else the recipe drew with them (SPO's tracker keys)."""

    stage: int
    problems: list[MathProblem]
    spec: SamplingSpec
    extra: Any = field(default=None)


def rollout_queue(
    config: RunConfig,
    runtime: TeamRuntime,
    plan: Callable[[int], RolloutPlan],
    generate: Callable[[RolloutPlan], tuple[list[Trajectory], dict[str, float]]],
) -> RolloutQueue:
    """The recipe's queue of rollouts (`rollout.max_staleness` stages ahead). Overlapped, the
    engines also return each sampled token's log-prob under the policy that sampled it."""
    K = config.rollout.max_staleness

    def planned(stage: int) -> RolloutPlan:
        stage_plan = plan(stage)
        if K == 0:
            return stage_plan
        return replace(stage_plan, spec=replace(stage_plan.spec, behaviour_logprobs=True))

    return RolloutQueue(K, planned, generate, runtime.weight_sync, runtime.agents)


@dataclass(frozen=True)
class Sampled:
    """What dynamic sampling kept: the prompts and their rollouts (`per_prompt` each, in prompt
    order), and its `groups/` metrics."""

    problems: list[MathProblem]
    trajectories: list[Trajectory]
    metrics: dict[str, float]


def dynamically_sampled(
    first: list[MathProblem],
    generate: Callable[[list[MathProblem], int, int], list[Trajectory]],
    draw: Callable[[int], list[MathProblem]],
    per_prompt: int,
    max_rounds: int,
) -> Sampled:
    """DAPO's dynamic sampling: the prompts' rollouts, keeping only prompts with a gradient (not
    every one of their `per_prompt` rewards equal), and `len(first)` more prompts drawn (the
    recipe's order) each round until `len(first)` are kept or `max_rounds` rounds are done.

    generate(problems, first_index, round) → their rollouts, prompt-major; first_index counts
    the prompts of earlier rounds (for the agents' rotation). draw(n) → the next n prompts."""
    target = len(first)
    kept: list[MathProblem] = []
    rows: list[Trajectory] = []
    problems, drawn, rounds, tokens = first, 0, 0, 0
    while True:
        trajectories = generate(problems, drawn, rounds)
        tokens += sum(model_tokens(t) for t in trajectories)
        for p, problem in enumerate(problems):
            group = trajectories[p * per_prompt : (p + 1) * per_prompt]
            if len({t.reward for t in group}) > 1:
                kept.append(problem)
                rows += group
        drawn, rounds = drawn + len(problems), rounds + 1
        if len(kept) >= target or rounds == max_rounds:
            break
        problems = draw(target)
    n = min(len(kept), target)
    rows = rows[: n * per_prompt]
    metrics = {"groups/kept": n, "groups/drawn": drawn, "groups/rounds": rounds}
    # what the engines generated for groups the stage does not train on
    metrics["tokens/dropped"] = tokens - sum(model_tokens(t) for t in rows)
    return Sampled(kept[:n], rows, metrics)


def model_tokens(trajectory: Trajectory) -> int:
    """The response tokens a model wrote (no tool output), as `tokens/generated` counts them."""
    return sum(trajectory.response_mask)


def off_policy_weights(
    batch: StageBatch, logp_cur: torch.Tensor, rollouts: StageRollouts, max_log_ratio: float
) -> torch.Tensor:
    """[N]: min(1, π_cur/π_behaviour) of each trajectory over its response tokens (each under
    its owner's policy), the log-ratio clamped to ±max_log_ratio, like SAT-Seq's c; exactly 1
    for rollouts the stage-start team generated (K = 0)."""
    if rollouts.staleness == 0:
        return torch.ones(len(batch.trajectories))
    tokens = batch.owned_by(list(range(batch.owns.shape[0])))
    return truncated_is_weights(logp_cur, batch.behaviour_logprobs, tokens, max_log_ratio)


def overlap_metrics(
    queue: RolloutQueue, rollouts: StageRollouts, w_off: torch.Tensor, timings: dict[str, float]
) -> dict[str, float]:
    """How busy the engines and learners were this stage (their share of its seconds) and,
    overlapped, the rollouts' staleness, the dropped ones and the off-policy weights."""
    stage_seconds = max(sum(timings.values()), 1e-9)
    learners = sum(timings.get(f"time/{phase}", 0.0) for phase in ("logprobs", "update"))
    metrics = {
        "util/engine_busy": min(queue.engine_seconds / stage_seconds, 1.0),
        "util/learner_busy": min(learners / stage_seconds, 1.0),
    }
    if queue.max_staleness > 0:
        metrics |= {
            "async/staleness_mean": float(rollouts.staleness),
            "async/dropped": queue.dropped,
            "async/is_weight_min": float(w_off.min()) if w_off.numel() else 1.0,
            "async/is_weight_mean": float(w_off.mean()) if w_off.numel() else 1.0,
        }
    return metrics
