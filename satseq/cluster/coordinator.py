"""The Coordinator actor: owns the team's actors and runs stages one after another (DESIGN §3).

The coordinator is the runtime: it starts the learners, rollout actors and sandbox pool, and
offers the steps every algorithm shares (sample and score, teacher-forced log-probs, push
weights, outputs, resume state). What one stage does is the algorithm's recipe, read top to
bottom in `satseq/cluster/recipes/<name>.py`: sat_seq, spo or grpo (`algorithm.name`).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from satseq.actors.learner import LearnerActor, UpdateResult
from satseq.actors.rollout import spread_requests
from satseq.actors.trajectory import SamplingSpec, Trajectory
from satseq.algo import maj_at_k
from satseq.cluster import builders
from satseq.cluster.checkpoint import load_latest_checkpoint, save_checkpoint
from satseq.cluster.metrics import StageLog
from satseq.cluster.placement import place_team
from satseq.cluster.recipes import make_recipe
from satseq.cluster.stage_batch import StageBatch
from satseq.config import RunConfig
from satseq.data import MathProblem, prompt_ids
from satseq.data.cursor import PromptCursor
from satseq.evaluation.datasets import resolve_dataset
from satseq.evaluation.outputs import write_predictions
from satseq.evaluation.team import evaluate_team
from satseq.models import load_tokenizer, resolve_model_path


class Coordinator:
    """Owns the team's actors and runs stages. Plain class; `CoordinatorActor` is its actor."""

    def __init__(self, config: RunConfig, output_dir: str, resume: bool = False):
        self.config = config
        self.output_dir = Path(output_dir)
        self.agents = [agent.name for agent in config.team.agents]
        self.problems = builders.training_problems(config)
        self.cursor = PromptCursor(len(self.problems), config.trainer.seed)
        self.scorer = builders.reward_scorer(config)
        self.prompt_format = builders.prompt_format(config)
        self.model_paths = [str(resolve_model_path(agent.path)) for agent in config.team.agents]
        self.tokenizers = [load_tokenizer(path) for path in self.model_paths]
        self.progress: dict[str, Any] = {"stage": 0, "phase": "starting", "agent": None}

        placement = place_team(config)
        self.sandbox = (
            builders.start_sandbox_pool(config, "satseq-sandbox-pool")
            if config.rollout.tools.enabled
            else None
        )
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
        self.rollouts = builders.start_rollout_actors(
            config,
            dict(zip(self.agents, self.model_paths, strict=True)),
            config.trainer.seed,
            lambda j: {"name": f"satseq-rollout-{j}"} | placement.rollout_options(j),
            sandbox=self.sandbox,
        )
        ray.get([actor.ready.remote() for actor in self.learners])

        self.val_problems = [
            problem
            for name in (config.data.val_files if config.trainer.val_every else [])
            for problem in resolve_dataset(name, config)
        ]
        self.stage = 0
        self.recipe = make_recipe(self)
        resumed_stage = self._restore() if resume else None
        self.log = StageLog(self.output_dir, config.output.tensorboard, resumed_stage)

    # --- one stage ----------------------------------------------------------------------------

    def run_stage(self) -> dict[str, Any]:
        """The recipe's stage `self.stage`, then its outputs and the resume checkpoint."""
        result = self.recipe.run_stage(self.stage)
        metrics = {"stage": self.stage, **result.metrics}
        if self._validation_due():
            self.set_progress("validation")
            metrics |= self.validate()
        self.stage += 1
        self._write_outputs(metrics, result.certificate)
        return metrics

    def _validation_due(self) -> bool:
        every, last = self.config.trainer.val_every, self.config.trainer.stages - 1
        return (
            bool(self.val_problems)
            and every > 0
            and ((self.stage + 1) % every == 0 or self.stage == last)
        )

    def validate(self) -> dict[str, float]:
        """The `satseq eval` routine on the validation set with the team's current weights;
        writes validation_data/<stage>.jsonl (the seeds' layout) and returns val/ metrics."""
        evaluation = evaluate_team(
            self.val_problems,
            self.agents,
            self.generate,
            self.tokenizers,
            self.prompt_format,
            self.scorer,
            self.config.eval.samples_per_agent,
            builders.eval_sampling_spec(self.config),
        )
        write_predictions(self.output_dir / "validation_data" / f"{self.stage}.jsonl", evaluation)
        return evaluation.metrics(prefix="val/")

    # --- the steps recipes share ------------------------------------------------------------------

    def sampling_spec(self) -> SamplingSpec:
        """This stage's sampling settings, seeded by the stage so a resumed run redraws alike."""
        return builders.sampling_spec(
            self.config, seed=self.config.trainer.seed * 1_000_003 + self.stage
        )

    def generate(self, requests, spec: SamplingSpec) -> list[list]:
        """Spread (agent, prompt ids, n) requests over the rollout actors; results in order."""
        return spread_requests(self.rollouts)(requests, spec)

    def prompt_ids(self, agent: int, problem: MathProblem) -> list[int]:
        return prompt_ids(self.tokenizers[agent], problem, self.prompt_format)

    def sample(
        self, problems: list[MathProblem], owners: list[list[int]], spec: SamplingSpec
    ) -> list[Trajectory]:
        """One trajectory per entry of owners[p] (the agent that answers prompt p), in order.

        Each agent answers the raw prompt on its own; one request per (prompt, agent) with n
        = that agent's share of the prompt's samples.
        """
        keys = [(p, a) for p in range(len(problems)) for a in sorted(set(owners[p]))]
        prompt_ids = {(p, a): self.prompt_ids(a, problems[p]) for p, a in keys}
        requests = [(self.agents[a], prompt_ids[p, a], owners[p].count(a)) for p, a in keys]
        samples = dict(zip(keys, self.generate(requests, spec), strict=True))
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
                        list(sample.response_mask or [1] * n),  # tool output is masked out
                        [a] * n,
                        sample.finish_reason,
                        text,
                        meta=dict(sample.meta),
                    )
                )
        return trajectories

    def score(self, problems: list[MathProblem], trajectories: list[Trajectory]) -> None:
        """Attach each trajectory's 0/1 reward (math-verify) for its prompt's answer."""
        scores = self.scorer.score_batch(
            [problems[t.prompt_index].problem for t in trajectories],
            [t.response_text for t in trajectories],
            [problems[t.prompt_index].answer for t in trajectories],
        )
        for trajectory, value in zip(trajectories, scores.scores, strict=True):
            trajectory.reward = float(value)

    def logprobs_by_owner(self, batch: StageBatch, rows: range | None = None) -> torch.Tensor:
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

    def _start_update(self, i: int, batch: StageBatch, rows: list[int], logp_cur, A, c):
        """Agent i's update on `rows` of the batch, started: a ref to its UpdateResult."""
        trajectories = [batch.trajectories[r] for r in rows]
        T = max((len(t.response_ids) for t in trajectories), default=1)
        return self.learners[i].update.remote(trajectories, logp_cur[rows, :T], A[rows], c[rows])

    def update_agents(
        self, batch: StageBatch, rows: list[list[int]], logp_cur, A, c
    ) -> list[UpdateResult]:
        """Every agent's update on its rows[i], in parallel; then the engines get the weights."""
        results = ray.get(
            [self._start_update(i, batch, rows[i], logp_cur, A, c) for i in range(len(self.agents))]
        )
        for i in range(len(self.agents)):
            self.push_weights(i)
        return results

    def update_agent(
        self, i: int, batch: StageBatch, rows: list[int], logp_cur, A, c
    ) -> UpdateResult:
        return ray.get(self._start_update(i, batch, rows, logp_cur, A, c))

    def values(self, i: int, batch: StageBatch, rows: list[int]) -> torch.Tensor:
        """`gae` mode: V(s_t) of agent i's value head on `rows`, [len(rows), T_i]."""
        return ray.get(self.learners[i].values.remote([batch.trajectories[r] for r in rows]))

    def fit_values(self, i: int, batch: StageBatch, rows: list[int], returns) -> float:
        """`gae` mode: agent i's value head fitted to the GAE returns of `rows`."""
        trajectories = [batch.trajectories[r] for r in rows]
        return ray.get(self.learners[i].fit_values.remote(trajectories, returns))

    def push_weights(self, i: int) -> None:
        """Agent i's rollout engines get its new weights (DESIGN §3 step 6, last line)."""
        weights = self.learners[i].weights.remote()
        ray.get([actor.load_weights.remote(self.agents[i], weights) for actor in self.rollouts])

    def team_vote_accuracy(self, trajectories: list[Trajectory], group_size: int) -> float:
        """maj@G: per prompt, the majority answer over its G trajectories (math-verify clusters)."""
        correct = []
        for start in range(0, len(trajectories), group_size):
            group = trajectories[start : start + group_size]
            answers = [self.scorer.extract_answer(t.response_text) for t in group]
            correct.append(
                maj_at_k(answers, [t.reward > 0.5 for t in group], self.scorer.answers_equivalent)
            )
        return float(np.mean(correct))

    def tool_metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """How much the stage used the sandbox: the share of trajectories that ran code, and
        the pool's execution statuses so far (cumulative counts)."""
        if self.sandbox is None:
            return {}
        calls = [t.meta.get("tool_calls", 0) for t in trajectories]
        pool = ray.get(self.sandbox.metrics.remote())
        return {
            "tools/call_fraction": float(np.mean([n > 0 for n in calls])),
            "tools/calls_mean": float(np.mean(calls)),
            **{f"sandbox/{status}": count for status, count in pool["statuses"].items()},
        }

    def set_progress(self, phase: str, agent: str | None = None) -> None:
        self.progress = {"stage": self.stage, "phase": phase, "agent": agent}

    # --- outputs and resume ---------------------------------------------------------------------

    def _write_outputs(self, metrics: dict[str, Any], certificate: dict[str, Any]) -> None:
        stage = metrics["stage"]
        self.log.write(metrics, {"stage": stage, **certificate})
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
            "recipe": self.recipe.state_dict(),
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
            self.push_weights(i)
        self.stage = state["stage"]
        self.cursor.load_state_dict(state["cursor"])
        self.recipe.load_state_dict(state["recipe"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        return completed_stage

    # --- progress (polled by the driver while a stage runs) -------------------------------------

    def get_progress(self) -> dict[str, Any]:
        return dict(self.progress)

    def next_stage(self) -> int:
        return self.stage

    def close(self) -> None:
        self.log.close()
        self.scorer.close()


CoordinatorActor = ray.remote(num_cpus=0, max_concurrency=2)(Coordinator)
