"""The team runtime: the steps every stage recipe takes on the team's learners and rollout
workers (sample, score, log-probs, update, push weights, ...).

A recipe types against `satseq.cluster.recipes.base.Runtime`; `TeamRuntime` implements it once,
over either kind of handle (`satseq.actors.calls`):

- Ray (`RayCalls`): the handles are `LearnerActor`s and `RolloutActor`s; calls to several actors
  run in parallel, and a learner's weights reach the rollout actors through the object store
  without passing through the coordinator. This is what `satseq train` runs.
- in-process (`InProcessCalls`): plain `Learner` and `RolloutWorker` objects in this process,
  called one after another. Recipes run on it in seconds, without Ray (tests/cluster/recipes).

Colocated (`trainer.offload: idle_agents`), the rollout engines sleep while the learners work and
wake up for generation; the runtime does both, so recipes never see it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from itertools import count
from typing import Any

import numpy as np
import ray
import torch

from satseq.actors.calls import ActorCalls, InProcessCalls, RayCalls
from satseq.actors.learner import (
    DistillResult,
    Learner,
    LearnerActor,
    PolicyStates,
    UpdateResult,
)
from satseq.actors.learner_group import learner_actors, start_learner_group
from satseq.actors.rollout import RolloutWorker, spread_requests
from satseq.actors.tool_loop import tool_usage
from satseq.actors.topology import chain_rollouts, owner_rollouts
from satseq.actors.trajectory import (
    Generation,
    GenerationRequest,
    Reference,
    SamplingSpec,
    Trajectory,
)
from satseq.actors.weight_transfer import (
    TensorSpec,
    TransferBackend,
    TransferEndpoint,
    update_info,
)
from satseq.algo import maj_at_k
from satseq.cluster.builders import LearnerSettings, agent_workers, learner_spec
from satseq.cluster.faults import ACTOR_LOSS, RESTARTED_ACTOR
from satseq.cluster.placement import place_team
from satseq.cluster.stage_batch import StageBatch
from satseq.config import RunConfig
from satseq.data import MathProblem, PromptFormat, prompt_ids
from satseq.launch.actors import start_rollout_actors, start_sandbox_pool
from satseq.launch.builders import engine_options, prompt_format, reward_scorer
from satseq.models import load_tokenizer, resolve_model_path
from satseq.rewards import RewardScorer

log = logging.getLogger(__name__)


class TeamRuntime:
    """The team's learners (one per agent, in team order) and rollout workers, and the steps
    recipes take on them (DESIGN §3 steps 2–6)."""

    def __init__(
        self,
        agents: list[str],
        tokenizers: list,
        prompt_format: PromptFormat,
        scorer: RewardScorer,
        learners: list,
        rollouts: list,
        calls: ActorCalls,
        sandbox: Any = None,
        agent_paths: list[str] | None = None,
        start_learner: Callable[[int, str], Any] | None = None,
        stop_learner: Callable[[Any], None] | None = None,
        colocated: bool = False,
        bucket_mb: float = 512.0,
        weight_transfer: TransferBackend | None = None,
    ):
        self.agents = agents
        self.agent_paths = agent_paths or []
        """Each agent's model as configured (`team.agents[i].path`, or a swap's `path`)."""
        self.start_learner = start_learner
        """`start_learner(i, path)`: a fresh learner for agent i on the model at `path`."""
        self.stop_learner = stop_learner
        self.tokenizers = tokenizers
        self.prompt_format = prompt_format
        self.scorer = scorer
        self.learners = learners
        self.rollouts = rollouts
        self.calls = calls
        self.sandbox = sandbox
        self.colocated = colocated
        """The rollout engines sleep during learner calls and wake up for generation."""
        self.engines_awake = True
        self.bucket_mb = bucket_mb
        """`rollout.weight_sync_bucket_mb`: the weight sync's bucket size."""
        self.weight_transfer = weight_transfer
        """The collective's backend of a collective weight sync; None: the object store."""
        self.transfer_manifests: dict[int, list[TensorSpec]] = {}
        """Agent i's weight manifest, once its learner and the engines formed their group."""
        self.weight_sync_seconds = 0.0
        self._spread = spread_requests(rollouts, calls)
        self.progress: dict[str, Any] = {"phase": "starting", "agent": None}

    # --- sampling ------------------------------------------------------------------------------

    def _call(self, handle: Any, method: str, *args: Any) -> Any:
        """One call on one actor, waited for."""
        return self.calls.wait([self.calls.start(handle, method, *args)])[0]

    def _start_learner(self, i: int, method: str, *args: Any) -> Any:
        """Begin a call on agent i's learner; colocated, the engines go to sleep first."""
        self._set_engines_awake(False)
        return self.calls.start(self.learners[i], method, *args)

    def _call_learner(self, i: int, method: str, *args: Any) -> Any:
        """One call on agent i's learner, waited for."""
        return self.calls.wait([self._start_learner(i, method, *args)])[0]

    def _set_engines_awake(self, awake: bool) -> None:
        """Colocated: every rollout worker's engines wake up or go to sleep, once per change."""
        if self.colocated and awake != self.engines_awake:
            method = "wake_up" if awake else "sleep"
            self.calls.wait([self.calls.start(worker, method) for worker in self.rollouts])
            self.engines_awake = awake

    def generate(
        self, requests: list[GenerationRequest], spec: SamplingSpec
    ) -> list[list[Generation]]:
        """Requests dealt round-robin over the rollout workers; colocated, the engines wake up
        first."""
        self._set_engines_awake(True)
        return self._spread(requests, spec)

    def prompt_ids(self, agent: int, problem: MathProblem) -> list[int]:
        """Agent `agent`'s prompt for `problem` (its tokenizer's chat template)."""
        return prompt_ids(self.tokenizers[agent], problem, self.prompt_format)

    def sample(
        self, problems: list[MathProblem], owners: list[list[int]], spec: SamplingSpec
    ) -> list[Trajectory]:
        """One scored trajectory per entry of owners[p] (the agent that answers problem p)."""
        return owner_rollouts(
            self.generate,
            self.agents,
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
            self.agents,
            handoff_ids,
            group_size,
            spec,
            _references(problems),
        )

    # --- learners ------------------------------------------------------------------------------

    def logprobs(self, batch: StageBatch, rows: range | None = None) -> torch.Tensor:
        """[N, T] log-probs of each token under the current weights of the agent that owns it
        (0 elsewhere); only `rows` are filled when given."""
        N, T = batch.owner_ids.shape
        out = torch.zeros(N, T, device="cpu")  # learners return their log-probs on the CPU
        rows_per_agent = [batch.rows_of(i, rows) for i in range(len(self.agents))]
        pending = {
            i: self._start_learner(i, "logprobs", [batch.trajectories[r] for r in agent_rows])
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
        return self._call_learner(agent, "logprobs", trajectories)

    def _start_update(self, i: int, batch: StageBatch, rows: list[int], logp_cur, A, c):
        trajectories = [batch.trajectories[r] for r in rows]
        T = max((len(t.response_ids) for t in trajectories), default=1)
        behaviour = None if logp_cur is None else logp_cur[rows, :T]
        return self._start_learner(i, "update", trajectories, behaviour, A[rows], c[rows])

    def update(self, i: int, batch: StageBatch, rows: list[int], logp_cur, A, c) -> UpdateResult:
        """Agent i's trust-region update on `rows` of the batch (logp_cur [N, T], A and c [N])."""
        return self.calls.wait([self._start_update(i, batch, rows, logp_cur, A, c)])[0]

    def update_all(
        self, batch: StageBatch, rows: list[list[int]], logp_cur, A, c
    ) -> list[UpdateResult]:
        """Every agent's update on its rows[i] at once, each followed by the push of its new
        weights (queued behind the update on its learner, so it starts the moment the update
        ends). logp_cur None: on-policy, each learner's current weights are the behaviour policy
        (`Learner.update` takes their log-probs from its first forward pass)."""
        n = len(self.agents)
        updates = [self._start_update(i, batch, rows[i], logp_cur, A, c) for i in range(n)]
        for i in range(n):  # each push streams as soon as its learner's update ends
            if self.weight_transfer is not None:  # engines wait inside a broadcast once asked
                self.calls.wait([updates[i]])
            self.push_weights(i)
        return self.calls.wait(updates)

    def values(self, i: int, batch: StageBatch, rows: list[int]) -> torch.Tensor:
        """`gae` mode: V(s_t) of agent i's value head on `rows`, [len(rows), T_i]."""
        trajectories = [batch.trajectories[r] for r in rows]
        return self._call_learner(i, "values", trajectories)

    def fit_values(self, i: int, batch: StageBatch, rows: list[int], returns) -> float:
        """`gae` mode: agent i's value head fitted to the GAE returns of `rows`."""
        trajectories = [batch.trajectories[r] for r in rows]
        return self._call_learner(i, "fit_values", trajectories, returns)

    def reset_learners(self) -> None:
        """Every learner back to its initial state (`Learner.reset`)."""
        self.calls.wait([self._start_learner(i, "reset") for i in range(len(self.learners))])

    def push_weights(self, i: int) -> None:
        """Agent i's rollout engines get its current weights (DESIGN §3 step 6, last line), in
        buckets of `rollout.weight_sync_bucket_mb`: broadcast by the learner over a collective
        (`satseq.actors.weight_transfer`), or through the object store."""
        if self.weight_transfer is not None:
            self._broadcast_weights(i)
        else:
            self._stream_weights(i)

    def _broadcast_weights(self, i: int) -> None:
        """The learner's rank 0 broadcasts, each engine receives: all in one round of calls.
        A failed round leaves no group trusted (the next push forms them again), and when an
        actor died it is that loss that is raised (the others' errors are its echo)."""
        manifest = self.transfer_manifests.get(i) or self._open_weight_transfer(i)
        info = update_info(manifest)
        pending = [
            self.calls.start(worker, "receive_weights", self.agents[i], info)
            for worker in self.rollouts
        ]
        pending.append(self.calls.start(self.learners[i], "send_weights", manifest))
        results, errors = [], []
        for call in pending:
            try:
                results += self.calls.wait([call])
            except Exception as error:
                errors.append(error)
        if errors:
            self.transfer_manifests.clear()
            raise next((e for e in errors if isinstance(e, ACTOR_LOSS)), errors[0])
        self.weight_sync_seconds += results[-1]

    def _open_weight_transfer(self, i: int) -> list[TensorSpec]:
        """Agent i's learner (rank 0 at rank 0) and each rollout actor's engine for agent i (at
        ranks 1, 2, ...) form a group; returns the manifest of what the learner sends."""
        host, port = self._call_learner(i, "transfer_address").rsplit(":", 1)
        endpoint = TransferEndpoint(
            host,
            int(port),
            1 + len(self.rollouts),
            self.weight_transfer,
            int(self.bucket_mb * 2**20),
        )
        joins = [
            self.calls.start(
                worker, "init_weight_transfer", self.agents[i], endpoint.worker_init_info(1 + j)
            )
            for j, worker in enumerate(self.rollouts)
        ]
        joins.append(self.calls.start(self.learners[i], "open_weight_transfer", endpoint))
        self.calls.wait(joins)
        self.transfer_manifests[i] = self._call_learner(i, "weight_manifest")
        return self.transfer_manifests[i]

    def forget_weight_transfers(self) -> None:
        """After an actor loss: the next push forms every weight-transfer group again."""
        self.transfer_manifests.clear()

    def _stream_weights(self, i: int) -> None:
        """Buckets (`Learner.weight_buckets`) through the object store: the learner gathers the
        next bucket while the engines load this one; no whole-model object exists, and on Ray
        no bucket passes through this process."""
        self._set_engines_awake(False)
        loading: list = []
        started = None  # the first bucket: the learner's queued work (an update) is done
        buckets = self.calls.stream(self.learners[i], "weight_buckets", self.bucket_mb)
        for bucket in buckets:
            started = started or time.perf_counter()
            self.calls.wait(loading)
            loading = [
                self.calls.start(worker, "load_weights", self.agents[i], bucket)
                for worker in self.rollouts
            ]
        self.calls.wait(loading)
        self.weight_sync_seconds += time.perf_counter() - (started or time.perf_counter())

    def take_weight_sync_seconds(self) -> float:
        """Seconds spent streaming weights to the engines since the last call."""
        seconds, self.weight_sync_seconds = self.weight_sync_seconds, 0.0
        return seconds

    # --- swapping an agent ----------------------------------------------------------------------

    def policy_states(self, i: int, trajectories: list[Trajectory]) -> PolicyStates:
        """Agent i's current policy at its response states of `trajectories` (a swap's π_cur)."""
        return self._call_learner(i, "policy_states", trajectories)

    def replace_agent(self, i: int, path: str) -> None:
        """Agent i gets a fresh learner on the model at `path` (its own optimiser, β from the
        config) in place of its old one, which is stopped; the rollout engines rebuild agent
        i's engine on that model. The caller pushes the new learner's weights when it is done."""
        resolved = str(resolve_model_path(path))
        self.stop_learner(self.learners[i])
        self.learners[i] = self.start_learner(i, path)
        self._call_learner(i, "ready")
        self.calls.wait(
            [
                self.calls.start(worker, "replace_agent", self.agents[i], resolved)
                for worker in self.rollouts
            ]
        )
        self.tokenizers[i] = load_tokenizer(resolved)
        self.agent_paths[i] = path
        self.transfer_manifests.pop(i, None)  # a new learner and new engines

    def distill(
        self,
        i: int,
        trajectories: list[Trajectory],
        current: PolicyStates,
        delta0: float,
        max_steps: int,
        lr: float,
        target_fraction: float,
    ) -> DistillResult:
        """Agent i's Stage-0 projection towards π_cur (`Learner.distill`)."""
        args = (trajectories, current, delta0, max_steps, lr, target_fraction)
        return self._call_learner(i, "distill", *args)

    # --- what the stage logs -------------------------------------------------------------------

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
        pool = self._call(self.sandbox, "metrics")
        usage = tool_usage([t.meta.get("tool_calls", 0) for t in trajectories], pool["statuses"])
        return {
            "tools/call_fraction": usage["call_fraction"],
            "tools/calls_mean": usage["calls_mean"],
            **{f"sandbox/{status}": count for status, count in usage["statuses"].items()},
        }

    def set_progress(self, phase: str, agent: str | None = None) -> None:
        """What the stage is doing now (the driver's progress line polls it)."""
        self.progress = {"phase": phase, "agent": agent}


def _references(problems: list[MathProblem]) -> list[Reference]:
    return [Reference(problem.problem, problem.answer) for problem in problems]


def start_on_ray(config: RunConfig, settings: LearnerSettings) -> TeamRuntime:
    """The team on Ray, in the run's one placement group: a `LearnerActor` per agent, the
    rollout actors and, with tools, the sandbox pool (`satseq train`). Ray restarts any of them
    that dies (`satseq.cluster.faults`)."""
    agents, model_paths = _team(config)
    placement = place_team(config)
    weight_transfer = placement.weight_transfer(config)
    log.info(
        "weight sync: %s",
        f"collective ({weight_transfer})" if weight_transfer else "object store",
    )
    sandbox = (
        start_sandbox_pool(config.sandbox, "satseq-sandbox-pool")
        if config.rollout.tools.enabled
        else None
    )
    generation = count()  # a swapped-in learner's actor gets a name of its own

    def start_learner(i: int, path: str | None = None):
        """Agent i's `LearnerActor`, or its `LearnerGroup` of W sharded ranks."""
        name = f"satseq-learner-{agents[i]}" + ("" if path is None else f"-{next(generation)}")
        spec = learner_spec(
            config,
            i,
            settings,
            placement.learner_device,
            placement.learner_threads(i),
            model_path=path,
        )
        if spec.workers == 1:
            options = placement.learner_options(i) | RESTARTED_ACTOR
            return LearnerActor.options(name=name, **options).remote(spec)
        return start_learner_group(
            spec,
            [
                {"name": f"{name}-rank{r}"} | placement.learner_options(i, r) | RESTARTED_ACTOR
                for r in range(spec.workers)
            ],
        )

    learners = [start_learner(i) for i in range(len(agents))]
    rollouts = start_rollout_actors(
        config,
        dict(zip(agents, model_paths, strict=True)),
        config.trainer.seed,
        lambda j: {"name": f"satseq-rollout-{j}"} | placement.rollout_options(j) | RESTARTED_ACTOR,
        sandbox=sandbox,
        weight_transfer=weight_transfer,
    )
    RayCalls().wait([learner.ready.remote() for learner in learners])
    return _runtime(
        config,
        agents,
        model_paths,
        learners,
        rollouts,
        RayCalls(),
        sandbox,
        weight_transfer=weight_transfer,
        start_learner=start_learner,
        stop_learner=lambda learner: [
            ray.kill(actor, no_restart=True) for actor in learner_actors(learner)
        ],
    )


def start_in_process(config: RunConfig, settings: LearnerSettings) -> TeamRuntime:
    """The team in this process, on the CPU, without Ray: a plain `Learner` per agent and one
    `RolloutWorker` (no tools). For tests of a recipe's wiring and for benchmarks."""
    if config.rollout.tools.enabled:
        raise ValueError("the in-process runtime runs no sandbox: set rollout.tools.enabled=false")
    if any(agent_workers(config, i) > 1 for i in range(len(config.team.agents))):
        raise ValueError(
            "the in-process runtime runs one learner per agent: set trainer.workers_per_agent=1"
        )
    agents, model_paths = _team(config)

    def start_learner(i: int, path: str | None = None) -> Learner:
        return Learner(learner_spec(config, i, settings, "cpu", 1, model_path=path))

    learners = [start_learner(i) for i in range(len(agents))]
    worker = RolloutWorker(
        dict(zip(agents, model_paths, strict=True)),
        config.rollout.engine,
        engine_options(config),
        config.trainer.seed,
        scorer=reward_scorer(config),
    )
    return _runtime(
        config,
        agents,
        model_paths,
        learners,
        [worker],
        InProcessCalls(),
        start_learner=start_learner,
        stop_learner=lambda learner: None,  # garbage-collected once replaced
    )


def _team(config: RunConfig) -> tuple[list[str], list[str]]:
    """The agents' names and model directories, in team order."""
    agents = [agent.name for agent in config.team.agents]
    return agents, [str(resolve_model_path(agent.path)) for agent in config.team.agents]


def _runtime(
    config,
    agents,
    model_paths,
    learners,
    rollouts,
    calls,
    sandbox=None,
    weight_transfer=None,
    **learner_factory,
) -> TeamRuntime:
    return TeamRuntime(
        agents,
        [load_tokenizer(path) for path in model_paths],
        prompt_format(config),
        reward_scorer(config),
        learners,
        rollouts,
        calls,
        sandbox=sandbox,
        agent_paths=[agent.path for agent in config.team.agents],
        colocated=config.trainer.offload == "idle_agents",
        bucket_mb=config.rollout.weight_sync_bucket_mb,
        weight_transfer=weight_transfer,
        **learner_factory,
    )
