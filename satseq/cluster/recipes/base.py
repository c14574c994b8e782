"""What a stage recipe may ask of the runtime, what it gives the coordinator, and small helpers
the recipes share."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from satseq.actors.learner import DistillResult, PolicyStates, UpdateResult
from satseq.actors.trajectory import GenerateFn, SamplingSpec, Trajectory
from satseq.cluster.builders import LearnerSettings
from satseq.cluster.metric_keys import PEAK_MEMORY
from satseq.cluster.stage_batch import StageBatch
from satseq.config import RunConfig
from satseq.data import MathProblem
from satseq.launch.builders import sampling_spec


class Runtime(Protocol):
    """The team's actors, as a recipe sees them (`satseq.cluster.runtime.TeamRuntime`, on Ray or
    in-process). Agents are indices into `agents`, in team order."""

    agents: list[str]
    agent_paths: list[str]
    tokenizers: list
    generate: GenerateFn

    def prompt_ids(self, agent: int, problem: MathProblem) -> list[int]:
        """Agent `agent`'s prompt for `problem`."""
        ...

    def sample(
        self, problems: list[MathProblem], owners: list[list[int]], spec: SamplingSpec
    ) -> list[Trajectory]:
        """One scored trajectory per entry of owners[p] (the agent that answers problem p)."""
        ...

    def sample_chains(
        self,
        problems: list[MathProblem],
        handoff_ids: list[list[int]],
        group_size: int,
        spec: SamplingSpec,
    ) -> list[Trajectory]:
        """G chains per problem in team order, each scored on its last turn."""
        ...

    def logprobs(self, batch: StageBatch, rows: range | None = None) -> torch.Tensor:
        """[N, T] log-probs of each token under its owner's current weights."""
        ...

    def agent_logprobs(self, agent: int, trajectories: list[Trajectory]) -> torch.Tensor:
        """[N, T] log-probs of `trajectories` under one agent's current weights."""
        ...

    def update(self, i: int, batch: StageBatch, rows: list[int], logp_cur, A, c) -> UpdateResult:
        """Agent i's update on `rows` of the batch."""
        ...

    def update_all(
        self, batch: StageBatch, rows: list[list[int]], logp_cur, A, c
    ) -> list[UpdateResult]:
        """Every agent's update on its rows[i] at once, then every agent's weights pushed.
        logp_cur None: each agent's current weights are its behaviour policy (on-policy)."""
        ...

    def values(self, i: int, batch: StageBatch, rows: list[int]) -> torch.Tensor: ...

    def fit_values(self, i: int, batch: StageBatch, rows: list[int], returns) -> float: ...

    def push_weights(self, i: int) -> None:
        """Agent i's rollout engines get its current weights."""
        ...

    def policy_states(self, i: int, trajectories: list[Trajectory]) -> PolicyStates:
        """Agent i's current policy at its response states (a swap's π_cur)."""
        ...

    def replace_agent(self, i: int, path: str) -> None:
        """Agent i gets a fresh learner and fresh engines on the model at `path`."""
        ...

    def distill(
        self,
        i: int,
        trajectories: list[Trajectory],
        current: PolicyStates,
        delta0: float,
        max_steps: int,
        lr: float,
        target_fraction: float,
    ) -> DistillResult:
        """Agent i's Stage-0 projection towards π_cur."""
        ...

    def team_vote_accuracy(self, trajectories: list[Trajectory], group_size: int) -> float: ...

    def tool_metrics(self, trajectories: list[Trajectory]) -> dict[str, float]: ...

    def set_progress(self, phase: str, agent: str | None = None) -> None: ...


@dataclass(frozen=True)
class StageResult:
    """A stage's metrics (metrics.jsonl / TensorBoard) and its certificate record."""

    metrics: dict[str, Any]
    certificate: dict[str, Any] = field(default_factory=dict)


class Recipe(Protocol):
    """One algorithm's stage, over a runtime's shared steps. A recipe class is built as
    `Recipe(config, runtime, problems)`; `learner_settings` is asked before the learners start."""

    @staticmethod
    def learner_settings(config: RunConfig) -> LearnerSettings: ...

    def run_stage(self, k: int) -> StageResult: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def stage_sampling_spec(config: RunConfig, k: int) -> SamplingSpec:
    """Stage k's sampling settings (`rollout:`), seeded by the stage so a resumed run redraws
    alike."""
    return sampling_spec(config, seed=config.trainer.seed * 1_000_003 + k)


def lap(timings: dict[str, float], key: str, since: float) -> float:
    """Record the seconds since `since` under `key`; returns now, the next lap's start."""
    now = time.perf_counter()
    timings[key] = now - since
    return now


def update_metrics(stats: UpdateResult) -> dict[str, float]:
    """What one agent's learner update did (UpdateResult → per-agent metrics). The update's peak
    device memory is there where the device reports one (CUDA), not on the CPU."""
    metrics = {
        "kl_quantile": stats.kl_quantile,  # NaN where not measured: left out below
        "beta": stats.steps[-1].beta if stats.steps else float("nan"),
        "backtracks": stats.backtracks,
        "accepted": stats.accepted_steps,
        "rejected": len(stats.steps) - stats.accepted_steps,
        "loss": stats.loss,
        "clip_fraction": stats.clip_fraction,
        "tokens_per_s": stats.tokens / max(stats.seconds, 1e-9),
    }
    if stats.peak_memory_gib is not None:
        metrics[PEAK_MEMORY] = stats.peak_memory_gib
    if math.isnan(stats.kl_quantile):
        del metrics["kl_quantile"]
    return metrics


def stage_metrics(rt: Runtime, batch: StageBatch, per_agent) -> dict[str, Any]:
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
