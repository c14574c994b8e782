"""Starting a team: its learners, rollout workers and sandbox pool, as a `TeamRuntime` on Ray
(`satseq train`) or in this process (tests of a recipe's wiring, benchmarks)."""

from __future__ import annotations

import logging
from itertools import count
from typing import Any

import ray

from satseq.actors.calls import ActorCalls, InProcessCalls, RayCalls
from satseq.actors.learner import Learner
from satseq.actors.learner.actor import LearnerActor, LearnerHostActor
from satseq.actors.learner.group import start_learner_group
from satseq.actors.learner.handle import ActorLearner, LearnerHandle, LocalLearner
from satseq.actors.learner.host import HostedLearner
from satseq.actors.learner.specs import LearnerSpec
from satseq.actors.rollout import RolloutWorker
from satseq.actors.weight_transfer import TransferBackend
from satseq.cluster.faults import RESTARTED_ACTOR
from satseq.cluster.learner_specs import (
    LearnerSettings,
    learner_hosts,
    learner_spec,
)
from satseq.cluster.placement import TeamPlacement, place_team
from satseq.cluster.runtime import TeamRuntime
from satseq.cluster.started_team import LearnerFactory, StartedTeam, SyncSettings
from satseq.config import RunConfig
from satseq.launch.actors import start_rollout_actors, start_sandbox_pool
from satseq.launch.agent_models import agent_model_dirs
from satseq.launch.settings import engine_options, prompt_format, reward_scorer
from satseq.models import load_tokenizer

log = logging.getLogger(__name__)


def start_on_ray(config: RunConfig, settings: LearnerSettings) -> TeamRuntime:
    """The team on Ray, in the run's one placement group: a `LearnerActor` per agent (a
    `LearnerHostActor` for the LoRA agents of one base, `learner_specs.learner_hosts`), the
    rollout actors and, with tools, the sandbox pool (`satseq train`). Ray restarts any of them
    that dies (`satseq.cluster.faults`)."""
    agents, model_paths = _team(config)
    hosts = learner_hosts(config.plan, model_paths)
    placement = place_team(config, hosts)
    weight_transfer = config.plan.weight_transfer(placement.learner_gpus, placement.rollout_gpus)
    log.info(
        "weight sync: %s",
        f"collective ({weight_transfer})" if weight_transfer else "object store",
    )
    sandbox = (
        start_sandbox_pool(config.sandbox, "satseq-sandbox-pool")
        if config.rollout.tools.enabled
        else None
    )
    factory = RayLearners(config, settings, placement)
    learners = factory.start_all(hosts)
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
        config, model_paths, learners, rollouts, RayCalls(), factory, sandbox, weight_transfer
    )


class RayLearners(LearnerFactory):
    """Agents' learners as Ray actors in the run's placement group: a `LearnerActor` (or a
    `LearnerGroup` of W sharded ranks) for an agent with a process of its own, a
    `LearnerHostActor` for a process of `learner_specs.learner_hosts` that holds several. Ray
    restarts any of them that dies."""

    def __init__(self, config: RunConfig, settings: LearnerSettings, placement: TeamPlacement):
        super().__init__(config)
        self.settings = settings
        self.placement = placement
        self.hosts: dict[int, Any] = {}
        """Agent → the `LearnerHostActor` that holds its learner (agents of a shared host)."""
        self._swaps = count()  # a swapped-in learner's actor gets a name of its own

    def start_all(self, hosts: list[list[int]]) -> list[LearnerHandle]:
        """Every agent's learner, in team order: one process of `hosts` each."""
        agents = [agent.name for agent in self.config.team.agents]
        learners: list[Any] = [None] * len(agents)
        for held in hosts:
            if len(held) == 1:
                learners[held[0]] = self.start(held[0])
                continue
            name = "satseq-learners-" + "-".join(agents[i] for i in held)
            options = self.placement.learner_options(held[0]) | RESTARTED_ACTOR
            host = LearnerHostActor.options(name=name, **options).remote(
                [self._spec(i) for i in held]
            )
            for i in held:
                self.hosts[i] = host
                learners[i] = HostedLearner(host, i)
        return learners

    def start(self, i: int, path: str | None = None) -> LearnerHandle:
        """Agent i's learner in a `LearnerActor` of its own, its `LearnerGroup` of W sharded
        ranks, or its learner in its host (a swapped-in learner takes its predecessor's place
        there)."""
        if i in self.hosts:
            ray.get(self.hosts[i].add.remote(self._spec(i, path)))
            return HostedLearner(self.hosts[i], i)
        agent = self.config.team.agents[i].name
        name = f"satseq-learner-{agent}" + ("" if path is None else f"-{next(self._swaps)}")
        spec = self._spec(i, path)
        if spec.workers == 1:
            options = self.placement.learner_options(i) | RESTARTED_ACTOR
            return ActorLearner(LearnerActor.options(name=name, **options).remote(spec))
        return start_learner_group(
            spec,
            [
                {"name": f"{name}-rank{r}"} | self.placement.learner_options(i, r) | RESTARTED_ACTOR
                for r in range(spec.workers)
            ],
        )

    def _spec(self, i: int, path: str | None = None) -> LearnerSpec:
        placement = self.placement
        return learner_spec(
            self.config,
            i,
            self.settings,
            placement.learner_device,
            placement.learner_threads(i),
            self.model_dir(i, path),
        )


class InProcessLearners(LearnerFactory):
    """Agents' learners as plain `Learner`s in this process, on the CPU, one thread each."""

    def __init__(self, config: RunConfig, settings: LearnerSettings):
        super().__init__(config)
        self.settings = settings

    def start(self, i: int, path: str | None = None) -> LearnerHandle:
        spec = learner_spec(self.config, i, self.settings, "cpu", 1, self.model_dir(i, path))
        return LocalLearner(Learner(spec))


def start_in_process(config: RunConfig, settings: LearnerSettings) -> TeamRuntime:
    """The team in this process, on the CPU, without Ray: a plain `Learner` per agent and one
    `RolloutWorker` (no tools). For tests of a recipe's wiring and for benchmarks."""
    if config.rollout.tools.enabled:
        raise ValueError("the in-process runtime runs no sandbox: set rollout.tools.enabled=false")
    if any(learner.workers > 1 for learner in config.plan.agents):
        raise ValueError(
            "the in-process runtime runs one learner per agent: set trainer.workers_per_agent=1"
        )
    agents, model_paths = _team(config)
    factory = InProcessLearners(config, settings)
    learners = [factory.start(i) for i in range(len(agents))]
    worker = RolloutWorker(
        dict(zip(agents, model_paths, strict=True)),
        config.rollout.engine,
        engine_options(config),
        config.trainer.seed,
        scorer=reward_scorer(config),
    )
    return _runtime(config, model_paths, learners, [worker], InProcessCalls(), factory)


def _team(config: RunConfig) -> tuple[list[str], list[str]]:
    """The agents' names and model directories (a LoRA agent's: its adapter's), in team
    order."""
    return [agent.name for agent in config.team.agents], agent_model_dirs(config)


def _runtime(
    config: RunConfig,
    model_paths: list[str],
    learners: list[LearnerHandle],
    rollouts: list[Any],
    calls: ActorCalls,
    factory: LearnerFactory,
    sandbox: Any = None,
    weight_transfer: TransferBackend | None = None,
) -> TeamRuntime:
    team = StartedTeam(
        [agent.name for agent in config.team.agents],
        [agent.path for agent in config.team.agents],
        model_paths,
        [load_tokenizer(path) for path in model_paths],
        learners,
        rollouts,
        sandbox,
    )
    sync = SyncSettings(
        config.plan.engines_share_devices, config.rollout.weight_sync_bucket_mb, weight_transfer
    )
    return TeamRuntime(team, calls, prompt_format(config), reward_scorer(config), factory, sync)
