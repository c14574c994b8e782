"""The Coordinator actor: SAT-Seq stages, one after another (DESIGN §3). This file is the recipe:
read `run_stage` top to bottom to see one stage's data flow.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from satseq.actors.chain import chain_rollouts
from satseq.actors.learner import LearnerActor
from satseq.actors.rollout import RolloutActor
from satseq.actors.trajectory import Trajectory, pad_batch
from satseq.algo import (
    AgentScheduler,
    bandit_lower_bound,
    group_advantages,
    maj_at_k,
    masked_sum,
    owner_mask,
    surrogate_gain,
    theorem_terms,
    truncated_is_weights,
    truncation_bias,
)
from satseq.cluster import builders
from satseq.cluster.checkpoint import load_latest_checkpoint, save_checkpoint
from satseq.cluster.metrics import StageLog
from satseq.cluster.placement import place_team
from satseq.cluster.team import mixture_assignment
from satseq.config import RunConfig
from satseq.data import apply_chat_template, build_prompt
from satseq.data.cursor import PromptCursor
from satseq.models import resolve_model_path

R_MIN, R_MAX = 0.0, 1.0  # verifiable rewards are 0 or 1
DEFAULT_ROLE_PROMPT = "Check the solution above and give the final answer in \\boxed{}."


@dataclass(frozen=True)
class StageBatch:
    """One stage's trajectories, ordered prompt by prompt (G each), as tensors [N, T]."""

    trajectories: list[Trajectory]
    rewards: torch.Tensor  # [N]
    owner_ids: torch.Tensor  # [N, T]
    response_mask: torch.Tensor  # [N, T]
    owns: torch.Tensor  # [n_agents, N]: whether agent i wrote any trained token of trajectory n
    n_train: int  # the first n_train trajectories train; the rest are held out for the bound

    @classmethod
    def build(cls, trajectories: list[Trajectory], n_agents: int, n_train: int) -> StageBatch:
        padded = pad_batch(trajectories, pad_token_id=0)
        owns = torch.stack(
            [
                owner_mask(padded.owner_ids, [i], padded.response_mask).sum(-1) > 0
                for i in range(n_agents)
            ]
        )
        rewards = torch.tensor([t.reward for t in trajectories])
        return cls(trajectories, rewards, padded.owner_ids, padded.response_mask, owns, n_train)

    def owned_by(self, agents: list[int]) -> torch.Tensor:
        return owner_mask(self.owner_ids, agents, self.response_mask)

    def rows_of(self, agent: int, rows: range) -> list[int]:
        return [i for i in rows if self.owns[agent, i]]


class Coordinator:
    """Owns the team's actors and runs stages. Plain class; `CoordinatorActor` is its actor."""

    def __init__(self, config: RunConfig, output_dir: str, resume: bool = False):
        self.config = config
        self.output_dir = Path(output_dir)
        self.agents = [agent.name for agent in config.team.agents]
        self.problems = builders.training_problems(config)
        self.cursor = PromptCursor(len(self.problems), config.trainer.seed)
        self.scorer = builders.reward_scorer(config)
        self.scheduler = AgentScheduler(
            self.agents, mode=config.sat_seq.scheduler, seed=config.trainer.seed
        )
        self.prompt_format = builders.prompt_format(config)
        self.model_paths = [str(resolve_model_path(agent.path)) for agent in config.team.agents]
        from transformers import AutoTokenizer

        self.tokenizers = [AutoTokenizer.from_pretrained(path) for path in self.model_paths]
        self.role_prompts = [
            agent.role_prompt or DEFAULT_ROLE_PROMPT for agent in config.team.agents
        ]
        if config.team.topology == "chain" and any(
            t.get_vocab() != self.tokenizers[0].get_vocab() for t in self.tokenizers
        ):
            raise ValueError("team.topology 'chain' needs agents that share one tokenizer")
        self.progress: dict[str, Any] = {"stage": 0, "phase": "starting", "agent": None}

        placement = place_team(config)
        self.learners = [
            LearnerActor.options(
                name=f"satseq-learner-{name}", **placement.learner_options(i)
            ).remote(
                builders.learner_spec(
                    config,
                    i,
                    placement.learner_device,
                    max(1, int(config.trainer.resources.num_cpus)),
                )
            )
            for i, name in enumerate(self.agents)
        ]
        self.rollouts = [
            RolloutActor.options(name=f"satseq-rollout-{j}", **placement.rollout_options(j)).remote(
                dict(zip(self.agents, self.model_paths, strict=True)),
                config.rollout.engine,
                {"num_threads": max(1, int(config.rollout.resources.num_cpus))},
                config.trainer.seed + 1000 * j,  # actors never share an unseeded random stream
            )
            for j in range(config.rollout.num_actors)
        ]
        ray.get([actor.ready.remote() for actor in self.learners + self.rollouts])

        self.stage = 0
        self.last_gains: dict[str, float] | None = None
        self.baseline_reward = (R_MIN + R_MAX) / 2  # b of the bandit bound, fixed before sampling
        resumed_stage = self._restore() if resume else None
        self.log = StageLog(self.output_dir, config.output.tensorboard, resumed_stage)

    # --- one stage ----------------------------------------------------------------------------

    def run_stage(self) -> dict[str, Any]:
        """DESIGN §3 steps 1–7 for stage `self.stage`; returns the stage's metrics."""
        cfg, k = self.config, self.stage
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        # 1. sample B prompts; the last holdout_fraction of them certify the stage
        problems = [self.problems[i] for i in self.cursor.next(cfg.trainer.batch_size)]
        n_holdout = math.floor(cfg.algorithm.certificate.holdout_fraction * len(problems))
        n_train_prompts = len(problems) - n_holdout
        clock = _lap(timings, "time/sample", clock)

        # 2. rollouts: G trajectories per prompt, agents assigned by the mixture topology
        self._set_progress("rollout")
        batch = self._rollouts(problems, n_train_prompts, first_prompt=k * cfg.trainer.batch_size)
        clock = _lap(timings, "time/rollout", clock)

        # 3. rewards (0/1, math-verify) are attached to the trajectories by _rollouts
        R = batch.rewards

        # 4. behaviour log-probs logp_cur: teacher-forced, stage-start weights, sampling temperature
        self._set_progress("logprobs")
        logp_cur = self._logprobs_by_owner(batch, range(len(batch.trajectories)))
        clock = _lap(timings, "time/logprobs", clock)

        # 5. the order σ of this stage's block-coordinate updates
        train = range(batch.n_train)
        G = cfg.sat_seq.group_size
        train_rows = [batch.rows_of(i, train) for i in range(len(self.agents))]
        uniform = group_advantages(R[train].view(-1, G), A_clip=cfg.sat_seq.A_clip)
        first_A = uniform.advantages.flatten()
        mean_abs_A = {
            name: float(first_A[rows].abs().mean()) if rows else 0.0
            for name, rows in zip(self.agents, train_rows, strict=True)
        }
        sigma = self.scheduler.order(k, last_gains=self.last_gains, mean_abs_advantage=mean_abs_A)

        # 6. update agent σ(1), then σ(2), ... each seeing the ones before it through c
        logp_hat = logp_cur.clone()
        per_agent: dict[str, dict[str, float]] = {}
        updated: list[int] = []
        for name in sigma:
            i = self.agents.index(name)
            self._set_progress("update", agent=name)
            updated_tokens = batch.owned_by(updated)
            log_ratio_prev = masked_sum(logp_hat - logp_cur, updated_tokens, dim=-1)
            c = truncated_is_weights(logp_hat, logp_cur, updated_tokens, cfg.sat_seq.max_log_ratio)
            A = group_advantages(
                R[train].view(-1, G), weights=c[train].view(-1, G), A_clip=cfg.sat_seq.A_clip
            ).advantages.flatten()
            rows = train_rows[i]
            stats = self._update_agent(i, batch, rows, logp_cur, A, c)
            own = batch.owned_by([i])[rows]
            T_i = stats.logp_hat.shape[1]  # the agent's rows are padded to their own longest
            logp_hat[rows, :T_i] = torch.where(
                own[:, :T_i] > 0, stats.logp_hat, logp_hat[rows, :T_i]
            )
            updated.append(i)
            self._push_weights(i)
            u = masked_sum(logp_hat[rows] - logp_cur[rows], own, dim=-1)
            terms = theorem_terms(
                surrogate=surrogate_gain(u, A[rows], c[rows]) if rows else 0.0,
                delta_i=stats.kl_quantile,
                A_max=cfg.sat_seq.A_clip,
                gamma=cfg.algorithm.gamma,
                zeta_i=truncation_bias(log_ratio_prev[rows], c[rows], cfg.sat_seq.A_clip)
                if rows
                else 0.0,
                N_i=len(rows),
                n_agents=len(self.agents),
                delta_conf=cfg.algorithm.certificate.delta_conf,
            )
            per_agent[name] = {
                "kl_quantile": stats.kl_quantile,
                "beta": stats.steps[-1].beta if stats.steps else float("nan"),
                "backtracks": stats.backtracks,
                "accepted": stats.accepted_steps,
                "rejected": len(stats.steps) - stats.accepted_steps,
                "loss": stats.loss,
                "clip_fraction": stats.clip_fraction,
                "tokens_per_s": stats.tokens / max(stats.seconds, 1e-9),
                "cert/information_gain": terms.information_gain,
                "cert/occupancy_shift": terms.occupancy_shift,
                "cert/estimator_bias": terms.estimator_bias,
                "cert/finite_sample": terms.finite_sample,
                "cert/lower_bound": terms.lower_bound,
            }
        clock = _lap(timings, "time/update", clock)

        # 7. certificate on the held-out prompts, metrics, outputs, checkpoint
        self._set_progress("certificate")
        bandit = self._bandit_certificate(batch, logp_cur)
        self.last_gains = {name: per_agent[name]["cert/lower_bound"] for name in self.agents}
        _lap(timings, "time/certificate", clock)
        metrics = self._stage_metrics(batch, per_agent, uniform.degenerate_groups, bandit) | timings
        self.baseline_reward = float(R.mean())
        self.stage += 1
        self._write_outputs(metrics, per_agent, bandit)
        return metrics

    # --- the steps -------------------------------------------------------------------------------

    def _rollouts(self, problems, n_train_prompts: int, first_prompt: int) -> StageBatch:
        """G trajectories per prompt (prompt-major) in the configured topology, scored."""
        cfg = self.config
        G = cfg.sat_seq.group_size
        spec = builders.sampling_spec(cfg, seed=cfg.trainer.seed * 1_000_003 + self.stage)
        if cfg.team.topology == "chain":
            trajectories = self._chain_rollouts(problems, spec)
        else:
            trajectories = self._mixture_rollouts(problems, spec, first_prompt)
        scores = self.scorer.score_batch(
            [problems[t.prompt_index].problem for t in trajectories],
            [t.response_text for t in trajectories],
            [problems[t.prompt_index].answer for t in trajectories],
        )
        for trajectory, score in zip(trajectories, scores.scores, strict=True):
            trajectory.reward = float(score)
        return StageBatch.build(trajectories, len(self.agents), n_train_prompts * G)

    def _generate(self, requests, spec) -> list[list]:
        """Spread (agent, prompt ids, n) requests over the rollout actors; results in order."""
        n_actors = len(self.rollouts)
        shards = ray.get(
            [
                actor.generate.remote(requests[j::n_actors], spec)
                for j, actor in enumerate(self.rollouts)
            ]
        )
        return [shards[r % n_actors][r // n_actors] for r in range(len(requests))]

    def _prompt_ids(self, agent: int, problem) -> list[int]:
        tokenizer = self.tokenizers[agent]
        return tokenizer.encode(
            build_prompt(tokenizer, problem, self.prompt_format), add_special_tokens=False
        )

    def _mixture_rollouts(self, problems, spec, first_prompt: int) -> list[Trajectory]:
        """Each trajectory is one agent's answer to the raw prompt; agents round-robin over G."""
        owners = mixture_assignment(
            len(problems), self.config.sat_seq.group_size, len(self.agents), first_prompt
        )
        # One request per (prompt, agent) with n = that agent's share of the G samples.
        keys = [(p, a) for p in range(len(problems)) for a in sorted(set(owners[p]))]
        prompt_ids = {(p, a): self._prompt_ids(a, problems[p]) for p, a in keys}
        requests = [(self.agents[a], prompt_ids[p, a], owners[p].count(a)) for p, a in keys]
        samples = dict(zip(keys, self._generate(requests, spec), strict=True))
        trajectories = []
        for p in range(len(problems)):
            for a in owners[p]:
                sample = samples[p, a].pop(0)
                n = len(sample.token_ids)
                text = self.tokenizers[a].decode(sample.token_ids, skip_special_tokens=True)
                trajectories.append(
                    Trajectory(
                        p,
                        prompt_ids[p, a],
                        list(sample.token_ids),
                        [1] * n,
                        [a] * n,
                        sample.finish_reason,
                        text,
                    )
                )
        return trajectories

    def _chain_rollouts(self, problems, spec) -> list[Trajectory]:
        """Agents answer in team order on one sequence; the last turn's text is scored."""
        tokenizer = self.tokenizers[0]  # chain agents share a tokenizer (checked at start-up)
        handoffs = [
            tokenizer.encode(
                "\n" + apply_chat_template(tokenizer, [{"role": "user", "content": role}]),
                add_special_tokens=False,
            )
            for role in self.role_prompts
        ]
        trajectories = chain_rollouts(
            self._generate,
            [self._prompt_ids(0, problem) for problem in problems],
            self.agents,
            handoffs,
            self.config.sat_seq.group_size,
            spec,
        )
        for trajectory in trajectories:
            start, end = trajectory.meta["turn_bounds"][-1]
            trajectory.response_text = tokenizer.decode(
                trajectory.response_ids[start:end], skip_special_tokens=True
            )
        return trajectories

    def _logprobs_by_owner(self, batch: StageBatch, rows: range) -> torch.Tensor:
        """[N, T] log-probs of each token under the current weights of the agent that owns it."""
        N, T = batch.owner_ids.shape
        out = torch.zeros(N, T)
        rows_per_agent = [batch.rows_of(i, rows) for i in range(len(self.agents))]
        refs = [
            self.learners[i].logprobs.remote([batch.trajectories[r] for r in agent_rows])
            if agent_rows
            else None
            for i, agent_rows in enumerate(rows_per_agent)
        ]
        for i, (agent_rows, ref) in enumerate(zip(rows_per_agent, refs, strict=True)):
            if ref is None:
                continue
            logp = ray.get(ref)
            own = batch.owned_by([i])[agent_rows, : logp.shape[1]]
            out[agent_rows, : logp.shape[1]] += logp * own
        return out

    def _update_agent(self, i: int, batch: StageBatch, rows: list[int], logp_cur, A, c):
        trajectories = [batch.trajectories[r] for r in rows]
        T = max((len(t.response_ids) for t in trajectories), default=1)
        return ray.get(
            self.learners[i].update.remote(trajectories, logp_cur[rows, :T], A[rows], c[rows])
        )

    def _push_weights(self, i: int) -> None:
        """Agent i's rollout engines get its new weights (DESIGN §3 step 6, last line)."""
        weights = self.learners[i].weights.remote()
        ray.get([actor.load_weights.remote(self.agents[i], weights) for actor in self.rollouts])

    def _bandit_certificate(
        self, batch: StageBatch, logp_cur: torch.Tensor
    ) -> dict[str, float] | None:
        """J(π_new) − J(π_start) ≥ bound, from the held-out trajectories (never trained on)."""
        holdout = range(batch.n_train, len(batch.trajectories))
        if len(holdout) < 2:
            return None
        logp_new = self._logprobs_by_owner(batch, holdout)
        rows = list(holdout)
        log_w = masked_sum(
            logp_new[rows] - logp_cur[rows],
            batch.owned_by(list(range(len(self.agents))))[rows],
            dim=-1,
        )
        cert = self.config.algorithm.certificate
        bound = bandit_lower_bound(
            log_w,
            batch.rewards[rows],
            b=self.baseline_reward,
            R_min=R_MIN,
            R_max=R_MAX,
            w_max=cert.w_max,
            delta_conf=cert.delta_conf,
            inequality=cert.inequality,
        )
        return {
            "estimate": bound.estimate,
            "deviation": bound.deviation,
            "truncation_bias": bound.truncation_bias,
            "lower_bound": bound.lower_bound,
            "n": bound.n,
        }

    def _stage_metrics(
        self, batch: StageBatch, per_agent, degenerate_groups: int, bandit
    ) -> dict[str, Any]:
        G = self.config.sat_seq.group_size
        R = batch.rewards
        metrics: dict[str, Any] = {
            "stage": self.stage,
            "reward/mean": float(R.mean()),
            "reward/team_vote": self._team_vote_accuracy(batch),
            "groups/degenerate_fraction": degenerate_groups / max(batch.n_train // G, 1),
            "response_length/mean": float(batch.response_mask.sum(-1).mean()),
            "certificate/bandit_lower_bound": bandit["lower_bound"] if bandit else float("nan"),
        }
        for i, name in enumerate(self.agents):
            rows = batch.rows_of(i, range(len(batch.trajectories)))
            metrics[f"reward/mean/{name}"] = float(R[rows].mean()) if rows else float("nan")
            for key, value in per_agent[name].items():
                metrics[f"{key}/{name}"] = value
        return metrics

    def _team_vote_accuracy(self, batch: StageBatch) -> float:
        """maj@G: per prompt, the majority answer over its G trajectories (math-verify clusters)."""
        G = self.config.sat_seq.group_size
        correct = []
        for start in range(0, len(batch.trajectories), G):
            group = batch.trajectories[start : start + G]
            answers = [self.scorer.extract_answer(t.response_text) for t in group]
            correct.append(
                maj_at_k(answers, [t.reward > 0.5 for t in group], self.scorer.answers_equivalent)
            )
        return float(np.mean(correct))

    # --- outputs and resume ---------------------------------------------------------------------

    def _write_outputs(self, metrics, per_agent, bandit) -> None:
        stage = metrics["stage"]
        certificate = {
            "stage": stage,
            "bandit": bandit,
            "agents": {
                name: {
                    k.removeprefix("cert/"): v for k, v in values.items() if k.startswith("cert/")
                }
                for name, values in per_agent.items()
            },
        }
        self.log.write(metrics, certificate)
        last = stage + 1 == self.config.trainer.stages
        if (stage + 1) % self.config.trainer.save_every == 0 or last:
            ray.get(
                [
                    learner.save_pretrained.remote(
                        str(self.output_dir / f"agent_{name}" / f"stage_{stage}")
                    )
                    for learner, name in zip(self.learners, self.agents, strict=True)
                ]
            )
        self.checkpoint()

    def checkpoint(self) -> None:
        """The resume state after the last complete stage, written atomically."""
        if self.stage == 0:
            return
        state = {
            "stage": self.stage,
            "learners": ray.get([learner.state_dict.remote() for learner in self.learners]),
            "cursor": self.cursor.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "last_gains": self.last_gains,
            "baseline_reward": self.baseline_reward,
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
            },
        }
        save_checkpoint(self.output_dir / "checkpoints", self.stage - 1, state)

    def _restore(self) -> int | None:
        """Load the newest checkpoint, push its weights to the engines; the stage it ended."""
        found = load_latest_checkpoint(self.output_dir / "checkpoints")
        if found is None:
            return None
        completed_stage, state = found
        ray.get(
            [
                learner.load_state_dict.remote(s)
                for learner, s in zip(self.learners, state["learners"], strict=True)
            ]
        )
        for i in range(len(self.agents)):
            self._push_weights(i)
        self.stage = state["stage"]
        self.cursor.load_state_dict(state["cursor"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.last_gains = state["last_gains"]
        self.baseline_reward = state["baseline_reward"]
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        return completed_stage

    # --- progress (polled by the driver while a stage runs) -------------------------------------

    def _set_progress(self, phase: str, agent: str | None = None) -> None:
        self.progress = {"stage": self.stage, "phase": phase, "agent": agent}

    def get_progress(self) -> dict[str, Any]:
        return dict(self.progress)

    def next_stage(self) -> int:
        return self.stage

    def close(self) -> None:
        self.log.close()
        self.scorer.close()


def _lap(timings: dict[str, float], key: str, since: float) -> float:
    now = time.perf_counter()
    timings[key] = now - since
    return now


CoordinatorActor = ray.remote(num_cpus=0, max_concurrency=2)(Coordinator)
