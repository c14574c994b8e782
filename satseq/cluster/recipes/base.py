"""What a stage recipe is, what it gives the coordinator, and small helpers the recipes share.

A recipe calls the team through `satseq.cluster.runtime.TeamRuntime` (on Ray or in-process);
it imports no Ray itself, so its math and wiring run in a plain process.
"""

from __future__ import annotations

import abc
import copy
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from satseq.actors.trajectory import SamplingSpec, Trajectory
from satseq.cluster.learner_specs import LearnerSettings
from satseq.cluster.recipes.stage_rollouts import RolloutPlan, rollout_queue
from satseq.config import RunConfig
from satseq.data import MathProblem
from satseq.data.cursor import PromptCursor
from satseq.launch.settings import sampling_spec
from satseq.seeds import stage_seed

if TYPE_CHECKING:
    from satseq.cluster.runtime import TeamRuntime


@dataclass(frozen=True)
class StageResult:
    """A stage's metrics (metrics.jsonl / TensorBoard) and its certificate record."""

    metrics: dict[str, Any]
    certificate: dict[str, Any] = field(default_factory=dict)


class Recipe(abc.ABC):
    """One algorithm's stage, over the runtime's shared steps, and what every recipe shares:
    the prompt cursor (data order), the rollout queue (`rollout.max_staleness` stages ahead,
    `stage_rollouts.rollout_queue`) over the recipe's `_plan` and `_generate`, the prompts a
    stage will train on, the resume state and `close`.

    A recipe class is built as `Recipe(config, runtime, problems)`; `learner_settings` is asked
    before the learners start. Each recipe adds what is its own: `learner_settings`,
    `run_stage`, `_generate`, and where it draws prompts otherwise than B at a time in the
    cursor's order, `_plan` and `_next_prompts`; its own resume state in `_state` and
    `_load_state`."""

    def __init__(self, config: RunConfig, runtime: TeamRuntime, problems: list[MathProblem]):
        self.config, self.runtime, self.problems = config, runtime, problems
        self.cursor = PromptCursor(len(problems), config.trainer.seed)
        self.queue = rollout_queue(config, runtime, self._plan, self._generate)

    @staticmethod
    @abc.abstractmethod
    def learner_settings(config: RunConfig) -> LearnerSettings:
        """Every learner's loss (the recipe's own), trust region and value head."""

    @abc.abstractmethod
    def run_stage(self, k: int) -> StageResult:
        """Stage k, top to bottom: its metrics and certificate."""

    @abc.abstractmethod
    def _generate(self, plan: RolloutPlan) -> tuple[list[Trajectory], dict[str, float]]:
        """The planned stage's scored trajectories and its generation metrics."""

    def _plan(self, k: int) -> RolloutPlan:
        """Stage k's B prompts, in the cursor's order."""
        cfg = self.config
        problems = [self.problems[i] for i in self.cursor.next(cfg.trainer.batch_size)]
        return RolloutPlan(k, problems, stage_sampling_spec(cfg, k))

    def upcoming_prompts(self, k: int) -> list[MathProblem]:
        """The prompts stage k will train on, the recipe's state left as it is (a swap's
        projection is measured on them): the queued ones, else what `_plan` would draw."""
        queued = self.queue.queued.get(k)
        if queued is not None:
            return queued.plan.problems
        return self._next_prompts(k)

    def _next_prompts(self, k: int) -> list[MathProblem]:
        """The B prompts the cursor gives next, the cursor left where it is."""
        B = min(self.config.trainer.batch_size, len(self.problems))
        return [self.problems[i] for i in copy.deepcopy(self.cursor).next(B)]

    def state_dict(self) -> dict[str, Any]:
        """The resume state: the cursor, the queue (complete, after its boundary), and the
        recipe's own (`_state`)."""
        return {
            "cursor": self.cursor.state_dict(),
            "queue": self.queue.state_dict(),
            **self._state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor.load_state_dict(state["cursor"])
        self.queue.load_state_dict(state["queue"])
        self._load_state(state)

    def _state(self) -> dict[str, Any]:
        return {}

    def _load_state(self, state: dict[str, Any]) -> None:  # noqa: B027 (no state: nothing)
        """The recipe's own part of `state` (what `_state` wrote)."""

    def close(self) -> None:
        """Stop generating ahead (`satseq.cluster.rollout_queue`): the recipe is replaced."""
        self.queue.close()


def stage_sampling_spec(config: RunConfig, k: int) -> SamplingSpec:
    """Stage k's sampling settings (`rollout:`), seeded by the stage so a resumed run redraws
    alike."""
    return sampling_spec(config, seed=stage_seed(config.trainer.seed, k))


def lap(timings: dict[str, float], key: str, since: float) -> float:
    """Record the seconds since `since` under `key`; returns now, the next lap's start."""
    now = time.perf_counter()
    timings[key] = now - since
    return now
