"""SAT-Seq's stage (DESIGN §3, §4): read `run_stage` top to bottom to see one stage's data flow."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from satseq.actors.topology import mixture_assignment
from satseq.algo import (
    AgentScheduler,
    gae,
    gae_group_advantages,
    group_advantages,
    masked_mean,
    masked_sum,
    terminal_rewards,
    truncated_is_weights,
)
from satseq.cluster.builders import loss_spec, trust_region_spec
from satseq.cluster.recipes.base import (
    LearnerSettings,
    Runtime,
    StageResult,
    lap,
    stage_metrics,
    stage_sampling_spec,
    update_metrics,
)
from satseq.cluster.recipes.certificate import (
    R_MAX,
    R_MIN,
    agent_certificate,
    bandit_certificate,
    certificate_record,
)
from satseq.cluster.stage_batch import StageBatch
from satseq.config import RunConfig
from satseq.data import MathProblem, apply_chat_template
from satseq.data.cursor import PromptCursor

DEFAULT_ROLE_PROMPT = "Check the solution above and give the final answer in \\boxed{}."


class SatSeqRecipe:
    """Block-coordinate updates of the agents in a scheduled order, each seeing the ones
    updated before it through truncated IS weights, under a quantile-KL trust region."""

    def __init__(self, config: RunConfig, runtime: Runtime, problems: list[MathProblem]):
        self.config, self.runtime, self.problems = config, runtime, problems
        self.cursor = PromptCursor(len(problems), config.trainer.seed)
        self.scheduler = AgentScheduler(
            runtime.agents, mode=config.sat_seq.scheduler, seed=config.trainer.seed
        )
        tokenizer = runtime.tokenizers[0]
        chain = config.team.topology == "chain"
        if chain and any(t.get_vocab() != tokenizer.get_vocab() for t in runtime.tokenizers):
            raise ValueError("team.topology 'chain' needs agents that share one tokenizer")
        # chain: the tokens that hand the sequence to agent k, its role as a user turn
        self.handoffs = [
            tokenizer.encode(
                "\n" + apply_chat_template(tokenizer, [{"role": "user", "content": role}]),
                add_special_tokens=False,
            )
            for role in (agent.role_prompt or DEFAULT_ROLE_PROMPT for agent in config.team.agents)
            if chain
        ]
        self.last_gains: dict[str, float] | None = None
        self.baseline_reward = (R_MIN + R_MAX) / 2  # b of the bandit bound, fixed before sampling

    @staticmethod
    def learner_settings(config: RunConfig) -> LearnerSettings:
        """The sequence-ratio PPO loss (`sat_seq`) under the quantile-KL trust region
        (`algorithm.kl_ctrl`); in `gae` mode a value head per learner."""
        s = config.sat_seq
        return LearnerSettings(
            loss_spec(s),
            trust_region_spec(config.algorithm.kl_ctrl),
            value_lr=s.value_lr if s.advantage == "gae" else None,
        )

    def run_stage(self, k: int) -> StageResult:
        """DESIGN §3 steps 1–7 for stage k."""
        rt, cfg = self.runtime, self.config
        agents = rt.agents
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        # 1. sample B prompts; the last holdout_fraction of them certify the stage
        problems = [self.problems[i] for i in self.cursor.next(cfg.trainer.batch_size)]
        n_holdout = math.floor(cfg.algorithm.certificate.holdout_fraction * len(problems))
        n_train_prompts = len(problems) - n_holdout
        clock = lap(timings, "time/sample", clock)

        # 2. rollouts: G trajectories per prompt, agents assigned by the team topology
        rt.set_progress("rollout")
        G = cfg.sat_seq.group_size
        trajectories = self._rollouts(problems, k)
        clock = lap(timings, "time/rollout", clock)

        # 3. rewards: 0/1, math-verify, scored by the rollout workers with the samples
        batch = StageBatch.build(trajectories, len(agents), n_train_prompts * G)
        R = batch.rewards

        # 4. behaviour log-probs logp_cur: teacher-forced, stage-start weights, sampling temperature
        rt.set_progress("logprobs")
        logp_cur = rt.logprobs(batch)
        clock = lap(timings, "time/logprobs", clock)

        # 5. the order σ of this stage's block-coordinate updates
        train = range(batch.n_train)
        train_rows = [batch.rows_of(i, train) for i in range(len(agents))]
        uniform = group_advantages(R[train].view(-1, G), A_clip=cfg.sat_seq.A_clip)
        first_A = uniform.advantages.flatten()
        mean_abs_A = {
            name: float(first_A[rows].abs().mean()) if rows else 0.0
            for name, rows in zip(agents, train_rows, strict=True)
        }
        sigma = self.scheduler.order(k, last_gains=self.last_gains, mean_abs_advantage=mean_abs_A)

        # 6. update agent σ(1), then σ(2), ... each seeing the ones before it through c
        logp_hat = logp_cur.clone()
        per_agent: dict[str, dict[str, float]] = {}
        updated: list[int] = []
        for name in sigma:
            i = agents.index(name)
            rt.set_progress("update", agent=name)
            updated_tokens = batch.owned_by(updated)
            log_ratio_prev = masked_sum(logp_hat - logp_cur, updated_tokens, dim=-1)
            c = truncated_is_weights(logp_hat, logp_cur, updated_tokens, cfg.sat_seq.max_log_ratio)
            rows = train_rows[i]
            if cfg.sat_seq.advantage == "gae" and rows:
                A, returns, value_metrics = self._gae_advantages(i, batch, rows, c)
            else:
                A = group_advantages(
                    R[train].view(-1, G), weights=c[train].view(-1, G), A_clip=cfg.sat_seq.A_clip
                ).advantages.flatten()
                returns, value_metrics = None, {}
            stats = rt.update(i, batch, rows, logp_cur, A, c)
            if returns is not None:  # the value head learns the returns with the updated weights
                value_metrics["value/loss"] = rt.fit_values(i, batch, rows, returns)
            own = batch.owned_by([i])[rows]
            T_i = stats.logp_hat.shape[1]  # the agent's rows are padded to their own longest
            logp_hat[rows, :T_i] = torch.where(
                own[:, :T_i] > 0, stats.logp_hat, logp_hat[rows, :T_i]
            )
            updated.append(i)
            rt.push_weights(i)
            u = masked_sum(logp_hat[rows] - logp_cur[rows], own, dim=-1)
            per_agent[name] = (
                update_metrics(stats)
                | value_metrics
                | agent_certificate(
                    cfg, u, A[rows], c[rows], log_ratio_prev[rows], stats.kl_quantile, len(agents)
                )
            )
        clock = lap(timings, "time/update", clock)

        # 7. certificate on the held-out prompts, metrics
        rt.set_progress("certificate")
        bandit = self._bandit_certificate(batch, logp_cur)
        self.last_gains = {name: per_agent[name]["cert/lower_bound"] for name in agents}
        lap(timings, "time/certificate", clock)
        metrics = {
            **stage_metrics(rt, batch, per_agent),
            "reward/team_vote": rt.team_vote_accuracy(batch.trajectories, G),
            "groups/degenerate_fraction": uniform.degenerate_groups / max(len(train) // G, 1),
            "certificate/bandit_lower_bound": bandit["lower_bound"] if bandit else float("nan"),
            **timings,
        }
        self.baseline_reward = float(R.mean())
        certificate = certificate_record(bandit, per_agent)
        return StageResult(metrics, certificate)

    # --- the steps -------------------------------------------------------------------------------

    def _rollouts(self, problems: list[MathProblem], k: int):
        """G scored trajectories per prompt (prompt-major) in the configured topology."""
        rt, cfg = self.runtime, self.config
        G = cfg.sat_seq.group_size
        spec = stage_sampling_spec(cfg, k)
        if cfg.team.topology == "chain":
            return rt.sample_chains(problems, self.handoffs, G, spec)
        # each trajectory is one agent's answer; agents round-robin over the G samples
        owners = mixture_assignment(len(problems), G, len(rt.agents), k * cfg.trainer.batch_size)
        return rt.sample(problems, owners, spec)

    def _gae_advantages(
        self, i: int, batch: StageBatch, rows: list[int], c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """`gae` mode (DESIGN §4): GAE(γ, λ) over agent i's tokens with its value head, the
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

    def _bandit_certificate(
        self, batch: StageBatch, logp_cur: torch.Tensor
    ) -> dict[str, float] | None:
        """The stage's bandit bound on the held-out trajectories, under the final weights."""
        holdout = range(batch.n_train, len(batch.trajectories))
        if len(holdout) < 2:
            return None
        logp_new = self.runtime.logprobs(batch, holdout)
        return bandit_certificate(self.config, batch, logp_cur, logp_new, self.baseline_reward)

    # --- resume -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "last_gains": self.last_gains,
            "baseline_reward": self.baseline_reward,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor.load_state_dict(state["cursor"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.last_gains = state["last_gains"]
        self.baseline_reward = state["baseline_reward"]
