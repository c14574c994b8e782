"""A stage's rollouts as the recipes plan, generate and correct them: each recipe plans its
prompts and owners (`RolloutPlan`), a `RolloutQueue` generates them now or up to
`rollout.max_staleness` stages ahead, and every rollout is weighed by the rollout correction
π_prox/π_behaviour (design §12), stale or not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from satseq.actors.trajectory import SamplingSpec, Trajectory
from satseq.algo.rollout_correction import CorrectionLevel, RolloutCorrection, rollout_correction
from satseq.cluster.rollout_queue import RolloutQueue, StageRollouts
from satseq.cluster.stage_batch import StageBatch
from satseq.config import RunConfig
from satseq.data import MathProblem

if TYPE_CHECKING:
    from satseq.cluster.runtime import TeamRuntime


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
    """The recipe's queue of rollouts (`rollout.max_staleness` stages ahead). With the rollout
    correction (or overlapped), the engines also return each sampled token's log-prob under the
    policy that sampled it."""
    rollout = config.rollout

    def planned(stage: int) -> RolloutPlan:
        stage_plan = plan(stage)
        if not config.plan.records_behaviour_logprobs:
            return stage_plan
        return replace(stage_plan, spec=replace(stage_plan.spec, behaviour_logprobs=True))

    return RolloutQueue(
        rollout.max_staleness, planned, generate, runtime.weight_sync, runtime.team.agents
    )


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
    group_size: int | None = None,
) -> Sampled:
    """DAPO's dynamic sampling: the prompts' rollouts, keeping only prompts with a gradient,
    and `len(first)` more prompts drawn (the recipe's order) each round until `len(first)` are
    kept or `max_rounds` rounds are done. A prompt's `per_prompt` rollouts are cut into the
    advantage groups of `group_size` (default: one group), as the recipe's advantages take them
    (GRPO: one per agent); a prompt has a gradient when one of its groups has rewards that are
    not all equal.

    When no prompt of any round has a gradient, the stage takes the last round's prompts as
    drawn (every advantage 0, as a stage without dynamic sampling would train them; `groups/kept`
    0), so it still has a batch.

    generate(problems, first_index, round) → their rollouts, prompt-major; first_index counts
    the prompts of earlier rounds (for the agents' rotation). draw(n) → the next n prompts."""
    target, G = len(first), group_size or per_prompt
    kept: list[MathProblem] = []
    rows: list[Trajectory] = []
    problems, drawn, rounds, tokens = first, 0, 0, 0
    while True:
        trajectories = generate(problems, drawn, rounds)
        tokens += sum(model_tokens(t) for t in trajectories)
        for p, problem in enumerate(problems):
            rollouts = trajectories[p * per_prompt : (p + 1) * per_prompt]
            if any(len({t.reward for t in group}) > 1 for group in _groups(rollouts, G)):
                kept.append(problem)
                rows += rollouts
        drawn, rounds = drawn + len(problems), rounds + 1
        if len(kept) >= target or rounds == max_rounds:
            break
        problems = draw(target)
    n = min(len(kept), target)
    rows = rows[: n * per_prompt]
    metrics = {"groups/kept": n, "groups/drawn": drawn, "groups/rounds": rounds}
    if not kept:
        kept, rows, n = list(problems), trajectories, len(problems)
    # what the engines generated for groups the stage does not train on
    metrics["tokens/dropped"] = tokens - sum(model_tokens(t) for t in rows)
    return Sampled(kept[:n], rows, metrics)


def model_tokens(trajectory: Trajectory) -> int:
    """The response tokens a model wrote (no tool output), as `tokens/generated` counts them."""
    return sum(trajectory.response_mask)


def _groups(rollouts: list[Trajectory], G: int) -> list[list[Trajectory]]:
    return [rollouts[start : start + G] for start in range(0, len(rollouts), G)]


def corrected(
    config: RunConfig, batch: StageBatch, logp_cur: torch.Tensor | None, level: CorrectionLevel
) -> RolloutCorrection | None:
    """The rollout correction of every trajectory (`rollout.correction`, design §12): the
    learner's proximal log-probs logp_cur [N, T] against the engines' behaviour ones, over the
    tokens each agent wrote under its own policy, at `level` unless the config sets one; None
    when it is off (every weight 1; logp_cur may then be None)."""
    correction = config.rollout.correction
    if correction.mode == "off":
        return None
    return rollout_correction(
        logp_cur,
        batch.behaviour_logprobs,
        batch.owned_by(list(range(batch.owns.shape[0]))),
        level if correction.level == "auto" else correction.level,
        correction.mode,
        correction.cap,
    )


def needs_proximal_logprobs(config: RunConfig, rollouts: StageRollouts) -> bool:
    """Whether a token-level recipe (GRPO, SPO) takes the stage-start log-probs before its
    updates: for the correction, or for rollouts an older team generated; otherwise each
    learner's first forward pass gives them."""
    return config.rollout.correction.mode != "off" or rollouts.staleness > 0


def correction_weights(correction: RolloutCorrection | None, N: int) -> torch.Tensor:
    """The correction's weights, [N] or [N, T]; ones [N] without it."""
    return torch.ones(N) if correction is None else correction.weights


def rollout_metrics(
    queue: RolloutQueue,
    rollouts: StageRollouts,
    correction: RolloutCorrection | None,
    timings: dict[str, float],
) -> dict[str, float]:
    """How busy the engines and learners were this stage (their share of its seconds), the
    rollout correction's weights and mismatch, and, overlapped, the rollouts' staleness and the
    dropped ones."""
    stage_seconds = max(sum(timings.values()), 1e-9)
    learners = sum(timings.get(f"time/{phase}", 0.0) for phase in ("logprobs", "update"))
    metrics = {
        "util/engine_busy": min(queue.engine_seconds / stage_seconds, 1.0),
        "util/learner_busy": min(learners / stage_seconds, 1.0),
    }
    if correction is not None:
        metrics |= correction.metrics()
    if queue.max_staleness > 0:
        metrics |= {
            "async/staleness_mean": float(rollouts.staleness),
            "async/dropped": queue.dropped,
        }
    return metrics
