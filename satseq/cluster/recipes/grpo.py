"""GRPO's stage (design §4): G samples per prompt, group-normalised advantages, PPO-clip.

With several agents, each agent is its own GRPO learner: it answers every prompt of the batch
G times, its groups are its own, and the agents update in parallel on their own samples.
"""

from __future__ import annotations

import time
from dataclasses import replace

from satseq.actors.learner.specs import LossSpec
from satseq.actors.trajectory import SamplingSpec, Trajectory
from satseq.algo import group_advantages
from satseq.cluster.learner_specs import PLAIN_STEPS, LearnerSettings
from satseq.cluster.recipes.base import Recipe, StageResult, lap
from satseq.cluster.recipes.stage_metrics import (
    near_zero_fraction,
    stage_metrics,
    team_vote_accuracy,
    update_metrics,
)
from satseq.cluster.recipes.stage_rollouts import (
    RolloutPlan,
    corrected,
    correction_weights,
    dynamically_sampled,
    needs_proximal_logprobs,
    rollout_metrics,
)
from satseq.cluster.stage_batch import StageBatch
from satseq.config import RunConfig
from satseq.data import MathProblem
from satseq.seeds import round_seed


class GrpoRecipe(Recipe):
    @staticmethod
    def learner_settings(config: RunConfig) -> LearnerSettings:
        """Token-level PPO-clip (`grpo`), plain steps, measured after each only if asked."""
        g = config.grpo
        loss = LossSpec(
            ratio="token", eps_low=g.eps_low, eps_high=g.eps_high, aggregation="token_mean"
        )
        return LearnerSettings(loss, replace(PLAIN_STEPS, measure=g.measure_step_kl))

    def run_stage(self, k: int) -> StageResult:
        rt, cfg = self.runtime, self.config
        G, n_agents = cfg.grpo.group_size, len(rt.team.agents)
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        # 1. B prompts, each answered G times by every agent: one group per (agent, prompt),
        # scored 0/1; generated now, or during an earlier stage's updates (max_staleness)
        rt.set_progress("rollout")
        rollouts = self.queue.take(k, cfg.trainer.stages - 1)
        batch = StageBatch.build(rollouts.trajectories, n_agents)
        clock = lap(timings, "time/rollout", clock)

        # 2. the proximal log-probs logp_cur at the sampling temperature (stage-start weights),
        # and each token's rollout correction w_t = π_cur/π_behaviour (design §12: the engine's
        # numerics, and an older team at K ≥ 1); with the correction off and K = 0, each
        # learner's first forward pass gives logp_cur (None here)
        logp_cur = rt.logprobs(batch) if needs_proximal_logprobs(cfg, rollouts) else None
        correction = corrected(cfg, batch, logp_cur, "token")
        clock = lap(timings, "time/logprobs", clock)

        # 3. A = (R − mean_G R) / (std_G R + 1e-6), verl's unbiased std; Dr.GRPO drops the std
        groups = group_advantages(
            batch.rewards.view(-1, G),
            normalize_std=not cfg.grpo.dr_grpo,
            eps=1e-6,
            unbiased_std=True,
        )
        A = groups.advantages.flatten()
        # no importance weights between agents (each updates on its own samples): c is the
        # rollout correction alone
        c = correction_weights(correction, len(batch.trajectories))

        # 4. every agent's PPO-clip update, in parallel, then the engines get the new weights
        rt.set_progress("update")
        rows = [batch.rows_of(i) for i in range(n_agents)]
        results = rt.update_all(batch, rows, logp_cur, A, c)
        clock = lap(timings, "time/update", clock)
        self.queue.boundary()
        lap(timings, "time/boundary", clock)

        per_agent = {
            name: update_metrics(stats) for name, stats in zip(rt.team.agents, results, strict=True)
        }
        metrics = {
            **stage_metrics(rt, batch, per_agent),
            # a prompt's n·G samples are contiguous: the team votes over all of them
            "reward/team_vote": team_vote_accuracy(rt.scorer, batch.trajectories, n_agents * G),
            "groups/degenerate_fraction": groups.degenerate_groups / max(len(groups.advantages), 1),
            "advantage/near_zero_fraction": near_zero_fraction(A),
            **rollouts.metrics,
            **rollout_metrics(self.queue, rollouts, correction, timings),
            **timings,
        }
        return StageResult(metrics)

    def _generate(self, plan: RolloutPlan) -> tuple[list[Trajectory], dict[str, float]]:
        """Each prompt answered G times by every agent (prompt-major, then agent). With
        dynamic sampling, a prompt none of whose (agent, prompt) groups has rewards that differ
        is dropped and more are drawn."""
        dynamic = self.config.rollout.dynamic_sampling
        if not dynamic.enabled:
            return self._rollouts(plan.problems, plan.spec), {}
        sampled = dynamically_sampled(
            plan.problems,
            lambda problems, first, r: self._rollouts(
                problems, replace(plan.spec, seed=round_seed(plan.spec.seed, r))
            ),
            lambda n: [self.problems[i] for i in self.cursor.next(n)],
            self.config.grpo.group_size * len(self.runtime.team.agents),
            dynamic.max_rounds,
            group_size=self.config.grpo.group_size,  # an agent's G answers are its own group
        )
        return sampled.trajectories, sampled.metrics

    def _rollouts(self, problems: list[MathProblem], spec: SamplingSpec) -> list[Trajectory]:
        G, n_agents = self.config.grpo.group_size, len(self.runtime.team.agents)
        prompts = [p for p in problems for _ in range(n_agents)]
        owners = [[a] * G for _ in problems for a in range(n_agents)]
        return self.runtime.sample(prompts, owners, spec)
