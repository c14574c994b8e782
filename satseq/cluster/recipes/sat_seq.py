"""SAT-Seq's stage (design §3, §4): read `run_stage` top to bottom to see one stage's data flow."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from satseq.actors.learner.specs import LossSpec
from satseq.actors.topology import mixture_assignment
from satseq.actors.trajectory import Trajectory
from satseq.algo import (
    AgentScheduler,
    GroupAdvantages,
    certified_alpha,
    gae,
    gae_group_advantages,
    group_advantages,
    masked_mean,
    terminal_rewards,
    truncated_is_weights,
)
from satseq.cluster.learner_specs import LearnerSettings, trust_region_spec
from satseq.cluster.recipes.base import Recipe, StageResult, lap
from satseq.cluster.recipes.certificate import (
    GAIN_KEY,
    R_MAX,
    R_MIN,
    HeldOut,
    agent_certificate,
    certificate_record,
    holdout_size,
    team_certificate,
)
from satseq.cluster.recipes.stage_metrics import stage_metrics, team_vote_accuracy, update_metrics
from satseq.cluster.recipes.stage_rollouts import (
    RolloutPlan,
    corrected,
    correction_weights,
    dynamically_sampled,
    rollout_metrics,
)
from satseq.cluster.rollout_queue import StageRollouts
from satseq.cluster.stage_batch import StageBatch
from satseq.config import RunConfig
from satseq.data import MathProblem, apply_chat_template
from satseq.seeds import round_seed

if TYPE_CHECKING:
    from satseq.cluster.runtime import TeamRuntime

DEFAULT_ROLE_PROMPT = "Check the solution above and give the final answer in \\boxed{}."


class SatSeqRecipe(Recipe):
    """Block-coordinate updates of the agents in a scheduled order, each seeing the ones
    updated before it through truncated IS weights, under a quantile-KL trust region."""

    def __init__(self, config: RunConfig, runtime: TeamRuntime, problems: list[MathProblem]):
        super().__init__(config, runtime, problems)
        self.scheduler = AgentScheduler(
            runtime.team.agents, mode=config.sat_seq.scheduler, seed=config.trainer.seed
        )
        tokenizer = runtime.team.tokenizers[0]
        chain = config.team.topology == "chain"
        if chain and any(t.get_vocab() != tokenizer.get_vocab() for t in runtime.team.tokenizers):
            raise ValueError("team.topology 'chain' needs agents that share one tokenizer")
        # chain: the tokens that hand the sequence to agent k, its role as a user turn
        self.handoffs = [
            tokenizer.encode(
                "\n"
                + apply_chat_template(
                    tokenizer, [{"role": "user", "content": role}], runtime.prompt_format
                ),
                add_special_tokens=False,
            )
            for role in (agent.role_prompt or DEFAULT_ROLE_PROMPT for agent in config.team.agents)
            if chain
        ]
        self.measure_held_out = config.algorithm.kl_ctrl.measure_on == "held_out"
        self.own_baseline = config.sat_seq.baseline == "agent"  # each agent's samples its group
        self.last_gains: dict[str, float] | None = None
        self.baseline_reward = (R_MIN + R_MAX) / 2  # b of the bandit bound, fixed before sampling

    @staticmethod
    def learner_settings(config: RunConfig) -> LearnerSettings:
        """The sequence-ratio PPO loss (`sat_seq`) under the quantile-KL trust region
        (`algorithm.kl_ctrl`); in `gae` mode a value head per learner."""
        s = config.sat_seq
        return LearnerSettings(
            LossSpec(ratio=s.ratio, eps_low=s.epsilon, eps_high=s.epsilon, aggregation="seq_mean"),
            trust_region_spec(config.algorithm.kl_ctrl),
            value_lr=s.value_lr if s.advantage == "gae" else None,
        )

    def run_stage(self, k: int) -> StageResult:
        """design §3 steps 1–7 for stage k."""
        rt, cfg, agents = self.runtime, self.config, self.runtime.team.agents
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        # 1–2. B prompts, G trajectories each, agents assigned by the team topology: generated
        # now, or while an earlier stage's learners updated (rollout.max_staleness, design §12);
        # the last holdout_fraction of the prompts certify the stage
        rt.set_progress("rollout")
        G = cfg.sat_seq.group_size
        rollouts = self.queue.take(k, cfg.trainer.stages - 1)
        n_holdout = holdout_size(cfg, len(rollouts.plan.problems))
        n_train = len(rollouts.trajectories) - n_holdout * G
        clock = lap(timings, "time/rollout", clock)

        # 3. rewards: 0/1, math-verify, scored by the rollout workers with the samples
        batch = StageBatch.build(rollouts.trajectories, len(agents), n_train)
        R = batch.rewards

        # 4. behaviour log-probs logp_cur: teacher-forced, stage-start weights, sampling
        # temperature; each trajectory weighs the rollout correction w = π_cur/π_behaviour
        # over its response (design §12: the engine's numerics, and an older team at K ≥ 1)
        rt.set_progress("logprobs")
        logp_cur = rt.logprobs(batch)
        correction = corrected(cfg, batch, logp_cur, "sequence")
        w = correction_weights(correction, len(batch.trajectories))
        clock = lap(timings, "time/logprobs", clock)

        # 5. the order σ of this stage's block-coordinate updates
        sigma, uniform = self._order(k, batch)

        # 6. update agent σ(1), then σ(2), ... each seeing the ones before it through c
        logp_hat = logp_cur.clone()
        per_agent: dict[str, dict[str, float]] = {}
        updated: list[int] = []
        for name in sigma:
            i = agents.index(name)
            rt.set_progress("update", agent=name)
            c = w * truncated_is_weights(
                logp_hat, logp_cur, batch.owned_by(updated), cfg.sat_seq.max_log_ratio
            )
            per_agent[name] = self._update_agent(i, batch, logp_cur, c, logp_hat)
            updated.append(i)
        clock = lap(timings, "time/update", clock)

        # 7. certificate on the held-out prompts (the team's bound against the policy that
        # generated them; each agent's gain estimate, which orders the next stage's
        # greedy_gain, and its theorem terms), the version boundary, metrics
        rt.set_progress("certificate")
        logp_from = logp_cur if rollouts.staleness == 0 else batch.behaviour_logprobs
        order = [agents.index(name) for name in sigma]
        bandit = self._certify(batch, logp_from, order, per_agent, rollouts)
        if bandit is not None:
            self.last_gains = {name: per_agent[name][GAIN_KEY] for name in agents}
        clock = lap(timings, "time/certificate", clock)
        self.queue.boundary()
        lap(timings, "time/boundary", clock)
        metrics = {
            **stage_metrics(rt, batch, per_agent),
            "reward/team_vote": team_vote_accuracy(rt.scorer, batch.trajectories, G),
            "groups/degenerate_fraction": uniform.degenerate_groups / max(batch.n_train // G, 1),
            "certificate/bandit_lower_bound": bandit["lower_bound"] if bandit else float("nan"),
            **rollouts.metrics,
            **rollout_metrics(self.queue, rollouts, correction, timings),
            **timings,
        }
        self.baseline_reward = float(R.mean())
        certificate = certificate_record(bandit, per_agent)
        return StageResult(metrics, certificate)

    # --- the steps -------------------------------------------------------------------------------

    def _order(self, k: int, batch: StageBatch) -> tuple[list[str], GroupAdvantages]:
        """design §3 step 5: the order σ of stage k's updates (by each agent's mean |A| under
        the uniform group advantages of the training rows, or the last stage's gains), and those
        advantages (they count the degenerate groups)."""
        cfg, agents, train = self.config, self.runtime.team.agents, range(batch.n_train)
        G = cfg.sat_seq.group_size
        uniform = group_advantages(batch.rewards[train].view(-1, G), A_clip=cfg.sat_seq.A_clip)
        first_A = uniform.advantages.flatten()
        mean_abs_A = {}
        for i, name in enumerate(agents):
            rows = batch.rows_of(i, train)
            mean_abs_A[name] = float(first_A[rows].abs().mean()) if rows else 0.0
        sigma = self.scheduler.order(k, last_gains=self.last_gains, mean_abs_advantage=mean_abs_A)
        return sigma, uniform

    def _update_agent(
        self,
        i: int,
        batch: StageBatch,
        logp_cur: torch.Tensor,
        c: torch.Tensor,
        logp_hat: torch.Tensor,
    ) -> dict[str, float]:
        """design §3 step 6 for agent i, seeing the agents updated before it through c (their
        truncated IS weights times the rollout correction): its advantages (group-normalised
        under c, or GAE's), its trust-region update on its training rows (checked on its
        held-out rows with `measure_on: held_out`), its new log-probs written into logp_hat on
        its own tokens, its weights pushed to the engines. Returns its metrics."""
        cfg, rt = self.config, self.runtime
        G, train = cfg.sat_seq.group_size, range(batch.n_train)
        rows = batch.rows_of(i, train)
        if cfg.sat_seq.advantage == "gae" and rows:
            A, returns, value_metrics = self._gae_advantages(i, batch, rows, c)
        else:
            weights = c[train] * (batch.owns[i, train] if self.own_baseline else 1.0)
            A = group_advantages(
                batch.rewards[train].view(-1, G),
                weights=weights.view(-1, G),
                A_clip=cfg.sat_seq.A_clip,
            ).advantages.flatten()
            returns, value_metrics = None, {}
        holdout = range(batch.n_train, len(batch.trajectories))
        checked = batch.rows_of(i, holdout) if self.measure_held_out else []
        stats = rt.update(i, batch, rows, logp_cur, A, c, checked)
        if returns is not None:  # the value head learns the returns with the updated weights
            value_metrics["value/loss"] = rt.fit_values(i, batch, rows, returns)
        own = batch.owned_by([i])[rows]
        T_i = stats.logp_hat.shape[1]  # the agent's rows are padded to their own longest
        logp_hat[rows, :T_i] = torch.where(
            own[:, :T_i] > 0, stats.logp_hat[: len(rows)], logp_hat[rows, :T_i]
        )
        rt.weight_sync.push(i)
        return (
            update_metrics(stats)
            | value_metrics
            | {
                "trust/certified_alpha": self._certified_alpha(stats, rows + checked),
                # on the agent's own rows: a mixed group's baseline need not centre them
                "advantage/own_mean": float(A[rows].mean()) if rows else 0.0,
                "is_weight/own_mean": float(c[rows].mean()) if rows else 1.0,
            }
        )

    def _certified_alpha(self, stats, rows: list[int]) -> float:
        """The level agent i's update certifies (design §4): the Clopper–Pearson bound at
        1 − η on the share of prompts (rows // G) with a sequence KL > target_kl, over the
        rows its check measured."""
        kl_ctrl = self.config.algorithm.kl_ctrl
        if stats.sequence_kl is None:  # nothing measured (no training rows this stage): n = 0
            return 1.0
        measured = ~stats.sequence_kl.isnan()
        units = torch.tensor(rows) // self.config.sat_seq.group_size
        return certified_alpha(
            stats.sequence_kl[measured], units[measured], kl_ctrl.target_kl, kl_ctrl.eta
        )

    def _generate(self, plan: RolloutPlan) -> tuple[list[Trajectory], dict[str, float]]:
        """G scored trajectories per prompt (prompt-major): the training prompts', then the
        held-out ones'. With dynamic sampling, training prompts whose G rewards are all equal
        are dropped and more drawn (the held-out prompts, which certify, are kept as drawn)."""
        cfg = self.config
        dynamic = cfg.rollout.dynamic_sampling
        if not dynamic.enabled:
            return self._rollouts(plan, plan.problems, 0, plan.spec), {}
        n_train = len(plan.problems) - holdout_size(cfg, len(plan.problems))
        train, held_out = plan.problems[:n_train], plan.problems[n_train:]
        sampled = dynamically_sampled(
            train,
            lambda problems, first, r: self._rollouts(
                plan, problems, first, replace(plan.spec, seed=round_seed(plan.spec.seed, r))
            ),
            lambda n: [self.problems[i] for i in self.cursor.next(n)],
            cfg.sat_seq.group_size,
            dynamic.max_rounds,
        )
        spec = replace(plan.spec, seed=round_seed(plan.spec.seed, dynamic.max_rounds))
        held = self._rollouts(plan, held_out, n_train, spec)  # a round no training one reaches
        return sampled.trajectories + held, sampled.metrics

    def _rollouts(self, plan: RolloutPlan, problems, first: int, spec) -> list[Trajectory]:
        """G scored trajectories per problem in the team topology: agents round-robin over the
        G samples (`mixture`, rotating from prompt plan.stage·B + first), or taking turns on one
        sequence (`chain`)."""
        cfg, rt = self.config, self.runtime
        G = cfg.sat_seq.group_size
        if cfg.team.topology == "chain":
            return rt.sample_chains(problems, self.handoffs, G, spec)
        offset = plan.stage * cfg.trainer.batch_size + first
        owners = mixture_assignment(len(problems), G, len(rt.team.agents), offset)
        return rt.sample(problems, owners, spec)

    def _gae_advantages(
        self, i: int, batch: StageBatch, rows: list[int], c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """`gae` mode (design §4): GAE(γ, λ) over agent i's tokens with its value head, the
        token-mean per trajectory, group-normalised under c (its own trajectories only) and
        clipped. Returns A [n_train] (0 off its rows), the returns [len(rows), T_i] for the
        value head, and the value metrics."""
        cfg = self.config
        V = self.runtime.values(i, batch, rows)
        own = batch.owned_by([i])[rows, : V.shape[1]]
        token_A, returns = gae(
            terminal_rewards(batch.rewards[rows], own),
            V,
            own,
            cfg.algorithm.gamma,
            cfg.algorithm.lam,
        )
        n_train = batch.n_train
        all_token_A, all_own = torch.zeros(n_train, V.shape[1]), torch.zeros(n_train, V.shape[1])
        all_token_A[rows], all_own[rows] = token_A, own
        A = gae_group_advantages(
            all_token_A,
            all_own,
            cfg.sat_seq.group_size,
            weights=c[:n_train] * batch.owns[i, :n_train],
            A_clip=cfg.sat_seq.A_clip,
        ).advantages.flatten()
        return A, returns, {"value/mean": float(masked_mean(V, own))}

    def _certify(
        self,
        batch: StageBatch,
        logp_from: torch.Tensor,
        order: list[int],
        per_agent: dict[str, dict[str, float]],
        rollouts: StageRollouts,
    ) -> dict[str, float] | None:
        """The stage's bandit bound on the held-out trajectories, from the policy that sampled
        them (logp_from [N, T]: the stage-start team's, or the older one `rollouts.version`
        names) to the final weights, and each agent's held-out certificate into per_agent;
        None without a hold-out."""
        holdout = range(batch.n_train, len(batch.trajectories))
        if len(holdout) < 2:
            return None
        held_out = HeldOut(batch, logp_from, self.runtime.logprobs(batch, holdout))
        G, b = self.config.sat_seq.group_size, self.baseline_reward
        for k, i in enumerate(order):
            name = self.runtime.team.agents[i]
            per_agent[name] |= agent_certificate(self.config, held_out, i, order[:k], G, b)
        bound = team_certificate(self.config, held_out, len(order), b)
        if rollouts.staleness > 0:  # the pair: π_new against the older team that sampled them
            bound["from_version"] = rollouts.version
        return bound

    # --- resume --------------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return {
            "scheduler": self.scheduler.state_dict(),
            "last_gains": self.last_gains,
            "baseline_reward": self.baseline_reward,
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.last_gains = state["last_gains"]
        self.baseline_reward = state["baseline_reward"]
