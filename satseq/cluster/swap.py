"""Plug-and-play: swap an agent in mid-training with the Stage-0 projection (SAT paper, third
claim; `team.swaps`, `satseq train --resume --swap AGENT=PATH`).

At the start of stage k, agent i's incoming model π_pre (same tokenizer) replaces its outgoing
policy π_cur, projected to within a mean per-state KL(π_θ ‖ π_cur) ≤ δ0 of it on the stage's
prompts (an in-sample mean, measured on the states it was fitted to: not the trust region's
quantile check, nor its certified level):

1. the outgoing agent answers the stage's prompts (`samples_per_prompt` each); its response
   states are where the projection is measured;
2. π_cur's output layer and hidden states at those states are taken from its learner, and its
   resume state is written aside (`swap_dir`);
3. the agent gets a fresh learner on π_pre (its own optimiser, β from the config) and fresh
   rollout engines;
4. that learner distils π_pre towards π_λ ∝ π_pre^{1/(1+λ)} π_cur^{λ/(1+λ)}, λ bisected so that
   the mean per-state KL(π_λ ‖ π_cur) ≤ `TARGET_FRACTION`·δ0, with a step-size search, until
   its own mean per-state KL(π_θ ‖ π_cur) ≤ δ0 or `max_steps`;
5. the swap stands only if δ0 was met (`swap/<agent>/budget_met`): otherwise the outgoing agent
   comes back as it was (its learner on its own model, its state loaded) and the swap is tried
   again at the next stage, continuing from the missed attempt's weights (kept in `swap_dir`),
   unless `on_budget_missed: keep` says to go on outside the budget;
6. the agent's weights go to the rollout engines, and the stage runs as usual.

Which states: the outgoing agent's own answers to the raw prompts (in `chain` topology too).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from satseq.actors.learner import Learner
from satseq.cluster.recipes.base import Recipe, stage_sampling_spec
from satseq.cluster.runtime import TeamRuntime
from satseq.config import RunConfig
from satseq.config.team import SwapConfig
from satseq.data import MathProblem
from satseq.models import load_tokenizer, resolve_model_path

log = logging.getLogger(__name__)

TARGET_FRACTION = 0.9
"""π_λ is aimed at 0.9·δ0: the distilled π_θ only approaches π_λ, and must itself meet δ0."""


def swaps_due(config: RunConfig, agent_paths: list[str], stage: int) -> list[SwapConfig]:
    """The swaps to make before `stage`, in config order: per agent the last one configured at
    or before it, where the agent does not hold its model yet (a swap that missed its budget
    stays due, and is tried again at each stage)."""
    names = [agent.name for agent in config.team.agents]
    latest: dict[str, SwapConfig] = {}
    for swap in config.team.swaps:
        if swap.at_stage <= stage and swap.at_stage >= getattr(
            latest.get(swap.agent), "at_stage", -1
        ):
            latest[swap.agent] = swap
    return [
        swap
        for swap in config.team.swaps
        if latest.get(swap.agent) is swap and agent_paths[names.index(swap.agent)] != swap.path
    ]


def check_same_tokenizer(outgoing: Any, outgoing_path: str, incoming: Any, incoming_path: str):
    """A swap keeps the token space: refuse an incoming model whose vocabulary differs."""
    if outgoing.get_vocab() != incoming.get_vocab():
        raise ValueError(
            f"cannot swap {outgoing_path!r} for {incoming_path!r}: their tokenizers differ "
            f"({len(outgoing.get_vocab())} vs {len(incoming.get_vocab())} tokens, or other "
            "ids); a swapped-in model must share the outgoing agent's tokenizer"
        )


def swap_agent(
    runtime: TeamRuntime,
    config: RunConfig,
    swap: SwapConfig,
    problems: list[MathProblem],
    stage: int,
    swap_dir: Path,
) -> dict[str, float]:
    """Agent `swap.agent` replaced by the model at `swap.path`, projected towards its outgoing
    policy, or kept where the projection misses δ0 (steps 1–6 of the module's docstring);
    returns the swap/<agent>/ metrics."""
    rt, name = runtime, swap.agent
    i = rt.team.agents.index(name)
    check_same_tokenizer(
        rt.team.tokenizers[i],
        rt.team.agent_paths[i],
        load_tokenizer(resolve_model_path(swap.path)),
        swap.path,
    )
    rt.set_progress("swap", agent=name)
    owners = [[i] * swap.samples_per_prompt for _ in problems]
    trajectories = rt.sample(problems, owners, stage_sampling_spec(config, stage))
    current = rt.call_learner(i, Learner.policy_states, trajectories)
    outgoing_path = rt.team.agent_paths[i]
    swap_dir.mkdir(parents=True, exist_ok=True)
    outgoing_state = rt.call_learner(i, Learner.save_state, str(swap_dir / f"outgoing_{name}.pt"))
    rt.replace_agent(i, swap.path)
    attempt = swap_dir / f"attempt_{name}_stage_{swap.at_stage}.pt"
    if attempt.exists():  # a retry continues from the missed attempt, not from π_pre again
        rt.call_learner(i, Learner.load_state, str(attempt))
    lr = swap.lr or config.trainer.lr
    args = (trajectories, current, swap.delta0, swap.max_steps, lr, TARGET_FRACTION)
    result = rt.call_learner(i, Learner.distill, *args)
    swapped = result.met_budget or swap.on_budget_missed == "keep"
    if not swapped:
        log.warning(
            "swap of %s for %s at stage %d missed its budget (mean KL %.4f > delta0 %.4f after "
            "%d steps): %s stays for this stage, the swap is tried again at the next",
            name,
            swap.path,
            stage,
            result.kl,
            swap.delta0,
            result.steps,
            name,
        )
        rt.call_learner(i, Learner.save_state, str(attempt))
        rt.replace_agent(i, outgoing_path)
        rt.call_learner(i, Learner.load_state, outgoing_state)
    else:
        attempt.unlink(missing_ok=True)
    rt.weight_sync.push(i)
    return {
        f"swap/{name}/lambda": result.lam,
        f"swap/{name}/kl": result.kl,
        f"swap/{name}/kl_before": result.kl_before,
        f"swap/{name}/steps": result.steps,
        f"swap/{name}/budget_met": int(result.met_budget),
        f"swap/{name}/swapped": int(swapped),
        f"swap/{name}/delta0": swap.delta0,
    }


def apply_swaps(
    runtime: TeamRuntime, config: RunConfig, recipe: Recipe, stage: int, swap_dir: Path
) -> dict[str, float]:
    """Every swap due before `stage`, on the stage's prompts; their metrics. swap_dir: where an
    outgoing agent's state waits while its successor is projected."""
    metrics: dict[str, float] = {}
    due = swaps_due(config, runtime.team.agent_paths, stage)
    if due:
        prompts = recipe.upcoming_prompts(stage)
        for swap in due:
            metrics |= swap_agent(runtime, config, swap, prompts, stage, swap_dir)
    return metrics
