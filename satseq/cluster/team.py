"""Starting a team: its learners, rollout workers and sandbox pool, as a `TeamRuntime` on Ray
(`satseq train`) or in this process (tests of a recipe's wiring, benchmarks)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import count
from typing import Any

import ray

from satseq.actors.calls import InProcessCalls, RayCalls
from satseq.actors.learner import Learner
from satseq.actors.learner.actor import LearnerActor, LearnerHostActor
from satseq.actors.learner.group import start_learner_group
from satseq.actors.learner.handle import learner_actors
from satseq.actors.learner.host import HostedLearner
from satseq.actors.learner.specs import LearnerSpec
from satseq.actors.rollout import RolloutWorker
from satseq.cluster.faults import RESTARTED_ACTOR
from satseq.cluster.learner_specs import (
    LearnerSettings,
    agent_workers,
    learner_hosts,
    learner_spec,
)
from satseq.cluster.placement import TeamPlacement, place_team
from satseq.cluster.runtime import TeamRuntime
from satseq.config import RunConfig
from satseq.launch.actors import start_rollout_actors, start_sandbox_pool
from satseq.launch.agent_models import agent_model_dir, agent_model_dirs
from satseq.launch.settings import engine_options, prompt_format, reward_scorer
from satseq.models import load_tokenizer

log = logging.getLogger(__name__)


def start_on_ray(config: RunConfig, settings: LearnerSettings) -> TeamRuntime:
    """The team on Ray, in the run's one placement group: a `LearnerActor` per agent (a
    `LearnerHostActor` for the LoRA agents of one base, `learner_specs.learner_hosts`), the
    rollout actors and, with tools, the sandbox pool (`satseq train`). Ray restarts any of them
    that dies (`satseq.cluster.faults`)."""
    agents, model_paths = _team(config)
    hosts = learner_hosts(config, model_paths)
    placement = place_team(config, hosts)
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
    learners, start_learner = _start_learners(config, settings, agents, placement, hosts)
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
        stop_learner=_stop_learner,
    )


def _start_learners(
    config: RunConfig,
    settings: LearnerSettings,
    agents: list[str],
    placement: TeamPlacement,
    hosts: list[list[int]],
) -> tuple[list[Any], Callable[..., Any]]:
    """Every agent's learner, started: a `LearnerActor` (or W ranks) per process of `hosts` that
    holds one agent, a `LearnerHostActor` per process that holds several; and
    `start_learner(i, path)`, which starts agent i's learner anew (a swap)."""
    generation = count()  # a swapped-in learner's actor gets a name of its own

    def spec(i: int, path: str | None = None) -> LearnerSpec:
        threads = placement.learner_threads(i)
        model_dir = agent_model_dir(config, i, path)
        return learner_spec(config, i, settings, placement.learner_device, threads, model_dir)

    hosts_of: dict[int, Any] = {}  # agent → the `LearnerHostActor` that holds its learner

    def start_learner(i: int, path: str | None = None):
        """Agent i's `LearnerActor`, its `LearnerGroup` of W sharded ranks, or its learner in
        its host (a swapped-in learner takes its predecessor's place there)."""
        if i in hosts_of:
            ray.get(hosts_of[i].add.remote(spec(i, path)))
            return HostedLearner(hosts_of[i], i)
        name = f"satseq-learner-{agents[i]}" + ("" if path is None else f"-{next(generation)}")
        agent_spec = spec(i, path)
        if agent_spec.workers == 1:
            options = placement.learner_options(i) | RESTARTED_ACTOR
            return LearnerActor.options(name=name, **options).remote(agent_spec)
        return start_learner_group(
            agent_spec,
            [
                {"name": f"{name}-rank{r}"} | placement.learner_options(i, r) | RESTARTED_ACTOR
                for r in range(agent_spec.workers)
            ],
        )

    learners: list[Any] = [None] * len(agents)
    for held in hosts:
        if len(held) == 1:
            learners[held[0]] = start_learner(held[0])
            continue
        name = "satseq-learners-" + "-".join(agents[i] for i in held)
        options = placement.learner_options(held[0]) | RESTARTED_ACTOR
        host = LearnerHostActor.options(name=name, **options).remote([spec(i) for i in held])
        for i in held:
            hosts_of[i] = host
            learners[i] = HostedLearner(host, i)
    return learners, start_learner


def _stop_learner(learner: Any) -> None:
    """Kill a learner's actors; a hosted learner leaves its host, which stays for the others."""
    if isinstance(learner, HostedLearner):
        ray.get(learner.host.drop.remote(learner.agent))
        return
    for actor in learner_actors(learner):
        ray.kill(actor, no_restart=True)


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
        model_dir = agent_model_dir(config, i, path)
        return Learner(learner_spec(config, i, settings, "cpu", 1, model_path=model_dir))

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
    """The agents' names and model directories (a LoRA agent's: its adapter's), in team
    order."""
    return [agent.name for agent in config.team.agents], agent_model_dirs(config)


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
        model_dirs=model_paths,
        agent_dir=lambda i, path: agent_model_dir(config, i, path),
        colocated=config.engines_share_devices,
        bucket_mb=config.rollout.weight_sync_bucket_mb,
        weight_transfer=weight_transfer,
        **learner_factory,
    )
