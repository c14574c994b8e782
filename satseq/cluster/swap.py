"""Plug-and-play: swap an agent in mid-training with the Stage-0 projection (SAT paper, third
claim; `team.swaps`, `satseq train --resume --swap AGENT=PATH`).

At the start of stage k, agent i's incoming model π_pre (same tokenizer) replaces its outgoing
policy π_cur without a coordinator's help and without losing the trust region's guarantee:

1. the outgoing agent answers the stage's prompts (`samples_per_prompt` each); its response
   states are where the projection is measured;
2. π_cur's output layer and hidden states at those states are taken from its learner;
3. the agent gets a fresh learner on π_pre (its own optimiser, β from the config) and fresh
   rollout engines;
4. that learner distils π_pre towards π_λ ∝ π_pre^{1/(1+λ)} π_cur^{λ/(1+λ)}, λ bisected so that
   the mean per-state KL(π_λ ‖ π_cur) ≤ `TARGET_FRACTION`·δ0, until its own mean per-state
   KL(π_θ ‖ π_cur) ≤ δ0 or `max_steps` (`swap/<agent>/budget_met` says which);
5. its weights go to the rollout engines, and the stage runs as usual.

Which states: the outgoing agent's own answers to the raw prompts (in `chain` topology too).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from satseq.cluster.recipes.base import Runtime, stage_sampling_spec
from satseq.config import RunConfig
from satseq.config.schema import SwapConfig
from satseq.data import MathProblem
from satseq.models import load_tokenizer, resolve_model_path

TARGET_FRACTION = 0.9
"""π_λ is aimed at 0.9·δ0: the distilled π_θ only approaches π_λ, and must itself meet δ0."""


def swaps_due(config: RunConfig, stage: int) -> list[SwapConfig]:
    """The swaps configured to happen before `stage`, in config order."""
    return [swap for swap in config.team.swaps if swap.at_stage == stage]


def stage_prompts(recipe: Any, problems: list[MathProblem], config: RunConfig, stage: int):
    """The B prompts the stage will train on (a copy of the recipe's cursor, left unmoved), or,
    for a recipe that samples otherwise (SPO), B prompts drawn with a seed of the stage."""
    B = min(config.trainer.batch_size, len(problems))
    cursor = getattr(recipe, "cursor", None)
    if cursor is not None:
        indices = copy.deepcopy(cursor).next(B)
    else:
        rng = np.random.default_rng([config.trainer.seed, stage])
        indices = rng.choice(len(problems), size=B, replace=False).tolist()
    return [problems[i] for i in indices]


def check_same_tokenizer(outgoing: Any, outgoing_path: str, incoming: Any, incoming_path: str):
    """A swap keeps the token space: refuse an incoming model whose vocabulary differs."""
    if outgoing.get_vocab() != incoming.get_vocab():
        raise ValueError(
            f"cannot swap {outgoing_path!r} for {incoming_path!r}: their tokenizers differ "
            f"({len(outgoing.get_vocab())} vs {len(incoming.get_vocab())} tokens, or other "
            "ids); a swapped-in model must share the outgoing agent's tokenizer"
        )


def swap_agent(
    runtime: Runtime,
    config: RunConfig,
    swap: SwapConfig,
    problems: list[MathProblem],
    stage: int,
) -> dict[str, float]:
    """Agent `swap.agent` replaced by the model at `swap.path`, projected towards its outgoing
    policy (steps 1–5 of the module's docstring); returns the swap/<agent>/ metrics."""
    rt, name = runtime, swap.agent
    i = rt.agents.index(name)
    check_same_tokenizer(
        rt.tokenizers[i],
        rt.agent_paths[i],
        load_tokenizer(resolve_model_path(swap.path)),
        swap.path,
    )
    rt.set_progress("swap", agent=name)
    owners = [[i] * swap.samples_per_prompt for _ in problems]
    trajectories = rt.sample(problems, owners, stage_sampling_spec(config, stage))
    current = rt.policy_states(i, trajectories)
    rt.replace_agent(i, swap.path)
    result = rt.distill(
        i,
        trajectories,
        current,
        swap.delta0,
        swap.max_steps,
        swap.lr or config.trainer.lr,
        TARGET_FRACTION,
    )
    rt.push_weights(i)
    return {
        f"swap/{name}/lambda": result.lam,
        f"swap/{name}/kl": result.kl,
        f"swap/{name}/kl_before": result.kl_before,
        f"swap/{name}/steps": result.steps,
        f"swap/{name}/budget_met": int(result.met_budget),
        f"swap/{name}/delta0": swap.delta0,
    }


def apply_swaps(
    runtime: Runtime, config: RunConfig, recipe: Any, problems: list[MathProblem], stage: int
) -> dict[str, float]:
    """Every swap due before `stage`, on the stage's prompts; their metrics."""
    metrics: dict[str, float] = {}
    due = swaps_due(config, stage)
    if due:
        prompts = stage_prompts(recipe, problems, config, stage)
        for swap in due:
            metrics |= swap_agent(runtime, config, swap, prompts, stage)
    return metrics
