"""What a stage logs, shared by the recipes: rewards, the team vote, tool use, each update."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from satseq.actors.learner.results import UpdateResult
from satseq.actors.tool_usage import tool_usage
from satseq.actors.trajectory import Trajectory
from satseq.algo import maj_at_k
from satseq.cluster.metric_keys import PEAK_MEMORY
from satseq.cluster.stage_batch import StageBatch
from satseq.rewards import RewardScorer

if TYPE_CHECKING:
    from satseq.cluster.runtime import TeamRuntime


def update_metrics(stats: UpdateResult) -> dict[str, float]:
    """What one agent's learner update did (UpdateResult → per-agent metrics): its epochs
    accepted and rejected, the trust region's q and β, the optimiser steps kept and those skipped
    for a non-finite gradient, and of its last attempt the loss, the share of clipped terms, the
    KL penalty and the largest ratio, and the share of padding in the training batch's layout.
    The update's peak device memory is there where the device reports one (CUDA)."""
    metrics = {
        "kl_quantile": stats.kl_quantile,
        "beta": stats.steps[-1].beta if stats.steps else float("nan"),
        "backtracks": stats.backtracks,
        "accepted": stats.accepted_steps,
        "rejected": len(stats.steps) - stats.accepted_steps,
        "update/steps": stats.optimizer_steps,
        "update/skipped_steps": stats.skipped_steps,
        "loss": stats.loss,
        "loss/clip_fraction": stats.clip_fraction,
        "loss/kl_penalty": stats.kl_penalty,
        "loss/ratio_max": stats.ratio_max,
        "tokens_per_s": stats.tokens / max(stats.seconds, 1e-9),
        "batch/padding_fraction": stats.padding_fraction,
    }
    if stats.peak_memory_gib is not None:
        metrics[PEAK_MEMORY] = stats.peak_memory_gib
    for key in ("kl_quantile", "batch/padding_fraction"):  # NaN: not measured
        if math.isnan(metrics[key]):
            del metrics[key]
    return metrics


def stage_metrics(rt: TeamRuntime, batch: StageBatch, per_agent) -> dict[str, Any]:
    """Rewards (team and per agent), response length, tool use, and each agent's update."""
    R = batch.rewards
    metrics: dict[str, Any] = {
        "reward/mean": float(R.mean()),
        "response_length/mean": float(batch.response_mask.sum(-1).mean()),
        "tokens/generated": int(batch.response_mask.sum()),  # sampled by the models, no tool text
        **tool_metrics(batch.trajectories, rt.sandbox_statuses()),
    }
    for i, name in enumerate(rt.team.agents):
        rows = batch.rows_of(i)
        metrics[f"reward/mean/{name}"] = float(R[rows].mean()) if rows else float("nan")
        for key, value in per_agent.get(name, {}).items():
            metrics[f"{key}/{name}"] = value
    return metrics


def team_vote_accuracy(
    scorer: RewardScorer, trajectories: list[Trajectory], group_size: int
) -> float:
    """maj@G: per prompt, the majority answer over its G trajectories (math-verify clusters)."""
    correct = []
    for start in range(0, len(trajectories), group_size):
        group = trajectories[start : start + group_size]
        answers = [scorer.extract_answer(t.response_text) for t in group]
        correct.append(
            maj_at_k(answers, [t.reward > 0.5 for t in group], scorer.answers_equivalent)
        )
    return float(np.mean(correct))


def tool_metrics(
    trajectories: list[Trajectory], statuses: dict[str, int] | None
) -> dict[str, float]:
    """How much the stage used the sandbox: the share of trajectories that ran code, and the
    pool's execution statuses so far (cumulative counts); nothing without a sandbox."""
    if statuses is None:
        return {}
    usage = tool_usage([t.meta.get("tool_calls", 0) for t in trajectories], statuses)
    return {
        "tools/call_fraction": usage["call_fraction"],
        "tools/calls_mean": usage["calls_mean"],
        **{f"sandbox/{status}": count for status, count in usage["statuses"].items()},
    }


def near_zero_fraction(A: torch.Tensor, tolerance: float = 1e-4) -> float:
    """The share of samples with |A| ≤ tolerance: they carry no gradient signal."""
    return float((A.abs() <= tolerance).float().mean()) if A.numel() else float("nan")
