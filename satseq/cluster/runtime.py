"""The team runtime: the steps every stage recipe takes on the team's learners and rollout
workers (sample, score, log-probs, update, push weights, ...).

Recipes call `TeamRuntime` on a `StartedTeam`, over either kind of handle (`satseq.actors.calls`):

- Ray (`RayCalls`): the handles are `LearnerActor`s and `RolloutActor`s; calls to several actors
  run in parallel, and a learner's weights reach the rollout actors through the object store
  without passing through the coordinator. This is what `satseq train` runs.
- in-process (`InProcessCalls`): plain `Learner` and `RolloutWorker` objects in this process,
  called one after another. Recipes run on it in seconds, without Ray
  (tests/cluster/test_recipe_wiring.py).

Both are started by `satseq.cluster.team` (`start_on_ray`, `start_in_process`). Colocated
(`trainer.offload: idle_agents`), the rollout engines sleep while the learners work and wake up
for generation (`EngineSleep`); the runtime does both, so recipes never see it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from satseq.actors.calls import ActorCalls
from satseq.actors.learner import Learner, UpdateResult
from satseq.actors.rollout import RolloutWorker, spread_requests
from satseq.actors.topology import chain_rollouts, owner_rollouts
from satseq.actors.trajectory import (
    Generation,
    GenerationRequest,
    Reference,
    SamplingSpec,
    Trajectory,
)
from satseq.cluster.engine_sleep import EngineSleep
from satseq.cluster.stage_batch import StageBatch
from satseq.cluster.started_team import LearnerFactory, StartedTeam, SyncSettings
from satseq.cluster.weight_sync import WeightSync
from satseq.data import MathProblem, PromptFormat, prompt_ids
from satseq.models import load_tokenizer
from satseq.rewards import RewardScorer
from satseq.sandbox.pool import SandboxPool


class TeamRuntime:
    """The steps recipes take on a started team's learners (one per agent, in team order) and
    rollout workers (design §3 steps 2–6). Agents are indices into `team.agents`."""

    def __init__(
        self,
        team: StartedTeam,
        calls: ActorCalls,
        prompt_format: PromptFormat,
        scorer: RewardScorer,
        learner_factory: LearnerFactory | None = None,
        sync: SyncSettings | None = None,
    ):
        self.team = team
        self.calls = calls
        self.prompt_format = prompt_format
        self.scorer = scorer
        self.learner_factory = learner_factory
        """Agent i's fresh learner for a swap (`replace_agent`); None: this team swaps none."""
        sync = sync or SyncSettings()
        self.engines = EngineSleep(team.rollouts, calls, sync.colocated)
        self.weight_sync = WeightSync(team, calls, self.engines, sync)
        """`weight_sync.push(i)`: agent i's engines get its learner's current weights."""
        self._spread = spread_requests(team.rollouts, calls)
        self.progress: dict[str, Any] = {"phase": "starting", "agent": None}

    # --- sampling ------------------------------------------------------------------------------

    def generate(
        self, requests: list[GenerationRequest], spec: SamplingSpec
    ) -> list[list[Generation]]:
        """Requests dealt round-robin over the rollout workers; colocated, the engines wake up
        first."""
        self.engines.set_awake(True)
        return self._spread(requests, spec)

    def prompt_ids(self, agent: int, problem: MathProblem) -> list[int]:
        """Agent `agent`'s prompt for `problem` (its tokenizer's chat template)."""
        return prompt_ids(self.team.tokenizers[agent], problem, self.prompt_format)

    def sample(
        self, problems: list[MathProblem], owners: list[list[int]], spec: SamplingSpec
    ) -> list[Trajectory]:
        """One scored trajectory per entry of owners[p] (the agent that answers problem p)."""
        return owner_rollouts(
            self.generate,
            self.team.agents,
            lambda p, a: self.prompt_ids(a, problems[p]),
            owners,
            _references(problems),
            spec,
        )

    def sample_chains(
        self,
        problems: list[MathProblem],
        handoff_ids: list[list[int]],
        group_size: int,
        spec: SamplingSpec,
    ) -> list[Trajectory]:
        """G chains per problem in team order, each scored on its last turn."""
        return chain_rollouts(
            self.generate,
            [self.prompt_ids(0, problem) for problem in problems],
            self.team.agents,
            handoff_ids,
            group_size,
            spec,
            _references(problems),
        )

    # --- learners ------------------------------------------------------------------------------

    def _start_learner(self, i: int, method: Callable, *args: Any) -> Any:
        """Begin `Learner.<method>` on agent i's learner; colocated, the engines sleep first."""
        self.engines.set_awake(False)
        return self.calls.start(self.team.learners[i], method, *args)

    def call_learner(self, i: int, method: Callable, *args: Any) -> Any:
        """`Learner.<method>` on agent i's learner, waited for."""
        return self.calls.wait([self._start_learner(i, method, *args)])[0]

    def logprobs(self, batch: StageBatch, rows: range | None = None) -> torch.Tensor:
        """[N, T] log-probs of each token under the current weights of the agent that owns it
        (0 elsewhere); only `rows` are filled when given."""
        N, T = batch.owner_ids.shape
        out = torch.zeros(N, T, device="cpu")  # learners return their log-probs on the CPU
        rows_per_agent = [batch.rows_of(i, rows) for i in range(len(self.team.agents))]
        pending = {
            i: self._start_learner(i, Learner.logprobs, [batch.trajectories[r] for r in agent_rows])
            for i, agent_rows in enumerate(rows_per_agent)
            if agent_rows
        }
        for i, logp in zip(pending, self.calls.wait(list(pending.values())), strict=True):
            agent_rows = rows_per_agent[i]
            own = batch.owned_by([i])[agent_rows, : logp.shape[1]]
            out[agent_rows, : logp.shape[1]] += logp * own
        return out

    def agent_logprobs(self, agent: int, trajectories: list[Trajectory]) -> torch.Tensor:
        """[N, T] log-probs of `trajectories` under agent `agent`'s current weights."""
        return self.call_learner(agent, Learner.logprobs, trajectories)

    def update(
        self,
        i: int,
        batch: StageBatch,
        rows: list[int],
        logp_cur,
        A,
        c,
        checked: list[int] = (),
    ) -> UpdateResult:
        """Agent i's trust-region update on `rows` of the batch (logp_cur [N, T], A [N], c [N]
        or [N, T]); its KL check measures the `checked` rows (never trained on) if given, else
        `rows`. The result's rows are `rows` then `checked`."""
        return self.calls.wait([self._start_update(i, batch, rows, logp_cur, A, c, checked)])[0]

    def _start_update(self, i: int, batch: StageBatch, rows: list[int], logp_cur, A, c, checked=()):
        every = list(rows) + list(checked)
        trajectories = [batch.trajectories[r] for r in every]
        T = max((len(t.response_ids) for t in trajectories), default=1)
        behaviour = None if logp_cur is None else logp_cur[every, :T]
        A_rows = torch.cat([A[rows], A.new_zeros(len(checked))])  # held-out rows train on nothing
        c_rows = c[every, :T] if c.dim() == 2 else c[every]
        return self._start_learner(
            i, Learner.update, trajectories, behaviour, A_rows, c_rows, len(checked)
        )

    def update_all(
        self, batch: StageBatch, rows: list[list[int]], logp_cur, A, c
    ) -> list[UpdateResult]:
        """Every agent's update on its rows[i] at once, each followed by the push of its new
        weights (queued behind the update on its learner, so it starts the moment the update
        ends). logp_cur None: on-policy, each learner's current weights are the behaviour policy
        (`Learner.update` takes their log-probs from its first forward pass)."""
        n = len(self.team.agents)
        updates = [self._start_update(i, batch, rows[i], logp_cur, A, c) for i in range(n)]
        for i in range(n):  # each push streams as soon as its learner's update ends
            if self.weight_sync.weight_transfer is not None:  # engines wait in a broadcast
                self.calls.wait([updates[i]])
            self.weight_sync.push(i)
        return self.calls.wait(updates)

    def values(self, i: int, batch: StageBatch, rows: list[int]) -> torch.Tensor:
        """`gae` mode: V(s_t) of agent i's value head on `rows`, [len(rows), T_i]."""
        trajectories = [batch.trajectories[r] for r in rows]
        return self.call_learner(i, Learner.values, trajectories)

    def fit_values(self, i: int, batch: StageBatch, rows: list[int], returns) -> float:
        """`gae` mode: agent i's value head fitted to the GAE returns of `rows`."""
        trajectories = [batch.trajectories[r] for r in rows]
        return self.call_learner(i, Learner.fit_values, trajectories, returns)

    def reset_learners(self) -> None:
        """Every learner back to its initial state (`Learner.reset`)."""
        resets = [self._start_learner(i, Learner.reset) for i in range(len(self.team.agents))]
        self.calls.wait(resets)

    # --- swapping an agent ----------------------------------------------------------------------

    def replace_agent(self, i: int, path: str) -> None:
        """Agent i gets a fresh learner on the model at `path` (its own optimiser, β from the
        config) in place of its old one, which is stopped; the rollout engines rebuild agent
        i's engine on that model. The caller pushes the new learner's weights when it is done."""
        factory = self.learner_factory
        if factory is None:
            raise RuntimeError("this team was started without a learner factory: it swaps none")
        resolved = factory.model_dir(i, path)
        self.team.learners[i].stop()
        self.team.learners[i] = factory.start(i, path)
        self.call_learner(i, Learner.ready)
        self.calls.wait(
            [
                self.calls.start(worker, RolloutWorker.replace_agent, self.team.agents[i], resolved)
                for worker in self.team.rollouts
            ]
        )
        self.team.tokenizers[i] = load_tokenizer(resolved)
        self.team.agent_paths[i] = path
        self.team.model_dirs[i] = resolved
        self.weight_sync.forget(i)  # a new learner and new engines

    # --- what the stage reports ----------------------------------------------------------------

    def sandbox_statuses(self) -> dict[str, int] | None:
        """The sandbox pool's execution statuses so far (cumulative counts); None without."""
        if self.team.sandbox is None:
            return None
        pool = self.calls.wait([self.calls.start(self.team.sandbox, SandboxPool.metrics)])[0]
        return pool["statuses"]

    def set_progress(self, phase: str, agent: str | None = None) -> None:
        """What the stage is doing now (the driver's progress line polls it)."""
        self.progress = {"phase": phase, "agent": agent}


def _references(problems: list[MathProblem]) -> list[Reference]:
    return [Reference(problem.problem, problem.answer) for problem in problems]
