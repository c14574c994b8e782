"""What a stage recipe is, what it gives the coordinator, and small helpers the recipes share.

A recipe calls the team through `satseq.cluster.runtime.TeamRuntime` (on Ray or in-process);
it imports no Ray itself, so its math and wiring run in a plain process.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from satseq.actors.trajectory import SamplingSpec
from satseq.cluster.learner_specs import LearnerSettings
from satseq.config import RunConfig
from satseq.data import MathProblem
from satseq.data.cursor import PromptCursor
from satseq.launch.settings import sampling_spec
from satseq.seeds import stage_seed


@dataclass(frozen=True)
class StageResult:
    """A stage's metrics (metrics.jsonl / TensorBoard) and its certificate record."""

    metrics: dict[str, Any]
    certificate: dict[str, Any] = field(default_factory=dict)


class Recipe(Protocol):
    """One algorithm's stage, over the runtime's shared steps. A recipe class is built as
    `Recipe(config, runtime, problems)`; `learner_settings` is asked before the learners start."""

    @staticmethod
    def learner_settings(config: RunConfig) -> LearnerSettings:
        """Every learner's loss (the recipe's own), trust region and value head."""
        ...

    def run_stage(self, k: int) -> StageResult: ...

    def upcoming_prompts(self, k: int) -> list[MathProblem]:
        """The prompts stage k will train on, the recipe's state left as it is (a swap's
        projection is measured on them)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Stop generating ahead (`satseq.cluster.rollout_queue`): the recipe is replaced."""
        ...


def stage_sampling_spec(config: RunConfig, k: int) -> SamplingSpec:
    """Stage k's sampling settings (`rollout:`), seeded by the stage so a resumed run redraws
    alike."""
    return sampling_spec(config, seed=stage_seed(config.trainer.seed, k))


def next_prompts(cursor: PromptCursor, problems: list[MathProblem], B: int) -> list[MathProblem]:
    """The B prompts `cursor` gives next, the cursor left where it is."""
    return [problems[i] for i in copy.deepcopy(cursor).next(min(B, len(problems)))]


def lap(timings: dict[str, float], key: str, since: float) -> float:
    """Record the seconds since `since` under `key`; returns now, the next lap's start."""
    now = time.perf_counter()
    timings[key] = now - since
    return now
