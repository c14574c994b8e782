"""What every stage recipe gives the coordinator, and small helpers they share."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from satseq.actors.learner import UpdateResult
    from satseq.cluster.coordinator import Coordinator
    from satseq.cluster.stage_batch import StageBatch


@dataclass(frozen=True)
class StageResult:
    """A stage's metrics (metrics.jsonl / TensorBoard) and its certificate record."""

    metrics: dict[str, Any]
    certificate: dict[str, Any] = field(default_factory=dict)


class Recipe(Protocol):
    """One algorithm's stage, over the coordinator's shared steps."""

    def run_stage(self, k: int) -> StageResult: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def lap(timings: dict[str, float], key: str, since: float) -> float:
    """Record the seconds since `since` under `key`; returns now, the next lap's start."""
    now = time.perf_counter()
    timings[key] = now - since
    return now


def update_metrics(stats: UpdateResult) -> dict[str, float]:
    """What one agent's learner update did (UpdateResult → per-agent metrics)."""
    return {
        "kl_quantile": stats.kl_quantile,
        "beta": stats.steps[-1].beta if stats.steps else float("nan"),
        "backtracks": stats.backtracks,
        "accepted": stats.accepted_steps,
        "rejected": len(stats.steps) - stats.accepted_steps,
        "loss": stats.loss,
        "clip_fraction": stats.clip_fraction,
        "tokens_per_s": stats.tokens / max(stats.seconds, 1e-9),
    }


def stage_metrics(rt: Coordinator, batch: StageBatch, per_agent) -> dict[str, Any]:
    """Rewards (team and per agent), response length, tool use, and each agent's update."""
    R = batch.rewards
    metrics: dict[str, Any] = {
        "reward/mean": float(R.mean()),
        "response_length/mean": float(batch.response_mask.sum(-1).mean()),
        "tokens/generated": int(batch.response_mask.sum()),  # sampled by the models, no tool text
        **rt.tool_metrics(batch.trajectories),
    }
    for i, name in enumerate(rt.agents):
        rows = batch.rows_of(i)
        metrics[f"reward/mean/{name}"] = float(R[rows].mean()) if rows else float("nan")
        for key, value in per_agent.get(name, {}).items():
            metrics[f"{key}/{name}"] = value
    return metrics


def near_zero_fraction(A: torch.Tensor, tolerance: float = 1e-4) -> float:
    """The share of samples with |A| ≤ tolerance: they carry no gradient signal."""
    return float((A.abs() <= tolerance).float().mean()) if A.numel() else float("nan")
