"""GRPO's stage (DESIGN §4): G samples per prompt, group-normalised advantages, PPO-clip.

With several agents, each agent is its own GRPO learner: it answers every prompt of the batch
G times, its groups are its own, and the agents update in parallel on their own samples.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from satseq.algo import group_advantages
from satseq.cluster.builders import PLAIN_STEPS, loss_spec
from satseq.cluster.recipes.base import (
    LearnerSettings,
    Runtime,
    StageResult,
    lap,
    near_zero_fraction,
    stage_metrics,
    stage_sampling_spec,
    update_metrics,
)
from satseq.cluster.stage_batch import StageBatch
from satseq.config import RunConfig
from satseq.data import MathProblem
from satseq.data.cursor import PromptCursor


class GrpoRecipe:
    def __init__(self, config: RunConfig, runtime: Runtime, problems: list[MathProblem]):
        self.config, self.runtime, self.problems = config, runtime, problems
        self.cursor = PromptCursor(len(problems), config.trainer.seed)

    @staticmethod
    def learner_settings(config: RunConfig) -> LearnerSettings:
        """Token-level PPO-clip (`grpo`), plain steps, measured after each only if asked."""
        steps = replace(PLAIN_STEPS, measure=config.grpo.measure_step_kl)
        return LearnerSettings(loss_spec(config.grpo), steps)

    def run_stage(self, k: int) -> StageResult:
        rt, cfg = self.runtime, self.config
        G, n_agents = cfg.grpo.group_size, len(rt.agents)
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        # 1. B prompts, each answered G times by every agent: one group per (agent, prompt)
        problems = [self.problems[i] for i in self.cursor.next(cfg.trainer.batch_size)]
        prompts = [p for p in problems for _ in range(n_agents)]
        owners = [[a] * G for _ in problems for a in range(n_agents)]
        clock = lap(timings, "time/sample", clock)
        rt.set_progress("rollout")
        trajectories = rt.sample(prompts, owners, stage_sampling_spec(cfg, k))  # scored, 0/1
        batch = StageBatch.build(trajectories, n_agents)
        clock = lap(timings, "time/rollout", clock)

        # 2. A = (R − mean_G R) / (std_G R + 1e-8); Dr.GRPO drops the std
        groups = group_advantages(batch.rewards.view(-1, G), normalize_std=not cfg.grpo.dr_grpo)
        A = groups.advantages.flatten()
        c = torch.ones_like(A)  # on-policy: no importance weights between agents

        # 3. every agent's PPO-clip update, in parallel, then the engines get the new weights.
        # On-policy, the behaviour log-probs at the sampling temperature are each learner's
        # own, taken in its update's first forward pass (logp_cur None).
        rt.set_progress("update")
        rows = [batch.rows_of(i) for i in range(n_agents)]
        results = rt.update_all(batch, rows, None, A, c)
        lap(timings, "time/update", clock)

        per_agent = {
            name: update_metrics(stats) for name, stats in zip(rt.agents, results, strict=True)
        }
        metrics = {
            **stage_metrics(rt, batch, per_agent),
            # a prompt's n·G samples are contiguous: the team votes over all of them
            "reward/team_vote": rt.team_vote_accuracy(batch.trajectories, n_agents * G),
            "groups/degenerate_fraction": groups.degenerate_groups / (len(problems) * n_agents),
            "advantage/near_zero_fraction": near_zero_fraction(A),
            **timings,
        }
        return StageResult(metrics)

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor.load_state_dict(state["cursor"])
