"""SPO's stage (design §4): one response per prompt, a persistent Beta tracker as the baseline.

Every agent is its own SPO learner with one tracker entry per (agent, raw problem text), its
prior from the offline scores. Each stage an agent draws its own B prompts by priority, answers
each once, and updates; its trackers are then updated with the log-probs after that step.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from satseq.actors.learner.specs import LossSpec
from satseq.actors.trajectory import Trajectory
from satseq.algo import BetaTracker, PrioritisedSampler, spo_advantages
from satseq.algo.spo import binarise_score
from satseq.cluster.learner_specs import PLAIN_STEPS, LearnerSettings
from satseq.cluster.recipes.base import Recipe, StageResult, lap, stage_sampling_spec
from satseq.cluster.recipes.stage_metrics import near_zero_fraction, stage_metrics, update_metrics
from satseq.cluster.recipes.stage_rollouts import (
    RolloutPlan,
    corrected,
    correction_weights,
    needs_proximal_logprobs,
    rollout_metrics,
)
from satseq.cluster.stage_batch import StageBatch
from satseq.config import RunConfig
from satseq.data import MathProblem

if TYPE_CHECKING:
    from satseq.cluster.runtime import TeamRuntime

logger = logging.getLogger(__name__)

Key = tuple[str, str]
"""A tracker key: (agent name, raw problem text)."""


class SpoRecipe(Recipe):
    def __init__(self, config: RunConfig, runtime: TeamRuntime, problems: list[MathProblem]):
        spo, trainer = config.spo, config.trainer
        offline = _offline_values(spo.offline_values)
        self.tracker = BetaTracker(spo.rho, spo.rho_min, spo.rho_max, spo.d_half)
        self.problem_of: dict[Key, Any] = {}
        self.keys: list[list[Key]] = []  # per agent, in data order
        for name in runtime.team.agents:
            keys = []
            for problem in problems:
                key = (name, problem.problem)
                if key in self.problem_of:  # the same problem text twice: one tracker
                    continue
                self.tracker.add(key, offline.get(problem.problem))
                self.problem_of[key] = problem
                keys.append(key)
            self.keys.append(keys)
        self.prompts_without_prior = self.tracker.n_without_prior // len(runtime.team.agents)
        if self.prompts_without_prior:
            logger.warning(
                "spo: %d of %d prompts have no offline scores (prior alpha = beta = 0.5); "
                "they are %s",
                self.prompts_without_prior,
                len(self.keys[0]),
                "sampled" if spo.sample_unscored_prompts else "never sampled",
            )
        self.sampler = PrioritisedSampler(
            spo.candidate_pool_size,
            gamma_s=spo.gamma_s,
            exclude_without_prior=not spo.sample_unscored_prompts,
            seed=trainer.seed,
        )
        super().__init__(config, runtime, problems)  # the queue plans by the draw above

    @staticmethod
    def learner_settings(config: RunConfig) -> LearnerSettings:
        """Token-level PPO-clip with clip-higher and dual-clip (`spo`), plain steps."""
        s = config.spo
        loss = LossSpec(
            ratio="token",
            eps_low=s.eps_low,
            eps_high=s.eps_high,
            dual_clip=s.dual_clip,
            aggregation="token_mean",
        )
        return LearnerSettings(loss, PLAIN_STEPS)

    def run_stage(self, k: int) -> StageResult:
        rt, B = self.runtime, self.config.trainer.batch_size
        n_agents = len(rt.team.agents)
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        # 1–2. each agent's B distinct prompts, drawn by priority w = sqrt(p̂(1 − p̂)) + 0.05,
        # one response each and its 0/1 reward: generated now, or during an earlier stage's
        # updates (rollout.max_staleness: the draw saw the trackers as they were then)
        rt.set_progress("rollout")
        rollouts = self.queue.take(k, self.config.trainer.stages - 1)
        drawn, trajectories = rollouts.plan.extra, rollouts.trajectories
        agent_rows = [range(a * B, (a + 1) * B) for a in range(n_agents)]
        p_hat = torch.tensor([self.tracker.p_hat(key) for key in drawn])  # before this step
        batch = StageBatch.build(trajectories, n_agents)
        r = torch.tensor([float(binarise_score(t.reward)) for t in trajectories])
        clock = lap(timings, "time/rollout", clock)

        # 3. A = r − p̂, normalised over each agent's batch; each token weighs the rollout
        # correction w_t = π_cur/π_behaviour under the stage-start log-probs (design §12); with
        # the correction off and K = 0, each learner's first forward pass gives logp_cur (None)
        A = torch.cat([spo_advantages(r[rows], p_hat[rows]) for rows in agent_rows])
        logp_cur = rt.logprobs(batch) if needs_proximal_logprobs(self.config, rollouts) else None
        correction = corrected(self.config, batch, logp_cur, "token")
        c = correction_weights(correction, len(trajectories))

        # 4. every agent's PPO-clip step, in parallel; then the engines get the new weights
        rt.set_progress("update")
        results = rt.update_all(batch, [list(rows) for rows in agent_rows], logp_cur, A, c)
        clock = lap(timings, "time/update", clock)

        # 5. the trackers, after the step: ρ from how far the policy moved, then r folds in
        rt.set_progress("tracker")
        rho = self._forgetting_factors(drawn)
        for a, rows in enumerate(agent_rows):
            for j, row in enumerate(rows):
                t = trajectories[row]
                n = len(t.response_ids)
                self.tracker.update(
                    drawn[row],
                    float(r[row]),
                    rho[row],
                    logprobs=results[a].logp_hat[j, :n],
                    mask=torch.tensor(t.response_mask, dtype=torch.float32),
                    token_ids=torch.tensor(t.response_ids),
                )
        clock = lap(timings, "time/tracker", clock)
        self.queue.boundary()
        lap(timings, "time/boundary", clock)

        per_agent = {
            name: update_metrics(stats) for name, stats in zip(rt.team.agents, results, strict=True)
        }
        metrics = {
            **stage_metrics(rt, batch, per_agent),
            "advantage/near_zero_fraction": near_zero_fraction(A),
            "spo/p_hat_mean": float(p_hat.mean()),
            "spo/p_hat_std": float(p_hat.std(unbiased=False)),
            "spo/rho_mean": float(np.mean(rho)),
            "spo/prompts_without_prior": self.prompts_without_prior,
            **rollout_metrics(self.queue, rollouts, correction, timings),
            **timings,
        }
        return StageResult(metrics)

    def _plan(self, k: int) -> RolloutPlan:
        """Stage k's draw: each agent's B distinct prompts, by priority, one response each."""
        B, n_agents = self.config.trainer.batch_size, len(self.runtime.team.agents)
        drawn = [
            key
            for a in range(n_agents)
            for key in self.sampler.sample(self.tracker, B, self.keys[a])
        ]
        problems = [self.problem_of[key] for key in drawn]
        return RolloutPlan(k, problems, stage_sampling_spec(self.config, k), extra=drawn)

    def _generate(self, plan: RolloutPlan) -> tuple[list[Trajectory], dict[str, float]]:
        B, n_agents = self.config.trainer.batch_size, len(self.runtime.team.agents)
        owners = [[a] for a in range(n_agents) for _ in range(B)]
        return self.runtime.sample(plan.problems, owners, plan.spec), {}

    def _forgetting_factors(self, drawn: list[Key]) -> list[float]:
        """ρ per drawn key. For `rho: kl`, a key's stored response is re-scored by the policy
        after this step, and D compares that with its log-probs stored at the last visit."""
        rt = self.runtime
        revisits = [key for key in drawn if self.tracker.last_response(key) is not None]
        logp_now: dict[Key, torch.Tensor] = {}
        if self.tracker.rho_mode == "kl" and revisits:
            for a, name in enumerate(rt.team.agents):
                keys = [key for key in revisits if key[0] == name]
                if not keys:
                    continue
                stored = [self._stored_trajectory(a, key) for key in keys]
                logp = rt.agent_logprobs(a, stored)
                for j, key in enumerate(keys):
                    n = len(self.tracker.last_response(key)["logprobs"])
                    logp_now[key] = logp[j, :n]
        return [self.tracker.rho(key, logp_now.get(key)) for key in drawn]

    def _stored_trajectory(self, agent: int, key: Key) -> Trajectory:
        response = self.tracker.last_response(key)
        token_ids = response["token_ids"].tolist()
        n = len(token_ids)
        return Trajectory(
            0,
            self.runtime.prompt_ids(agent, self.problem_of[key]),
            token_ids,
            response["mask"].int().tolist(),
            [agent] * n,
            "stop",
        )

    def _next_prompts(self, k: int) -> list[MathProblem]:
        """SPO draws its prompts by priority, after the swap: B prompts drawn with a seed of the
        stage stand for them."""
        B = min(self.config.trainer.batch_size, len(self.problems))
        rng = np.random.default_rng([self.config.trainer.seed, k])
        return [self.problems[i] for i in rng.choice(len(self.problems), size=B, replace=False)]

    def _state(self) -> dict[str, Any]:
        return {"tracker": self.tracker.state_dict(), "sampler": self.sampler.state_dict()}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state["tracker"])
        self.sampler.load_state_dict(state["sampler"])


def _offline_values(path: str | None) -> dict[str, list[float]]:
    if path is None:
        return {}
    from satseq.offline import load_offline_values

    return load_offline_values(path)
