"""Starting a team: its learners, rollout workers and sandbox pool, as a `TeamRuntime` on Ray
(`satseq train`) or in this process (tests of a recipe's wiring, benchmarks)."""

from __future__ import annotations

import logging
from itertools import count

import ray

from satseq.actors.calls import InProcessCalls, RayCalls
from satseq.actors.learner import Learner
from satseq.actors.learner.actor import LearnerActor
from satseq.actors.learner.group import learner_actors, start_learner_group
from satseq.actors.rollout import RolloutWorker
from satseq.cluster.faults import RESTARTED_ACTOR
from satseq.cluster.learner_specs import LearnerSettings, agent_workers, learner_spec
from satseq.cluster.placement import place_team
from satseq.cluster.runtime import TeamRuntime
from satseq.config import RunConfig
from satseq.launch.actors import start_rollout_actors, start_sandbox_pool
from satseq.launch.agent_models import agent_model_dir, agent_model_dirs
from satseq.launch.settings import engine_options, prompt_format, reward_scorer
from satseq.models import load_tokenizer

log = logging.getLogger(__name__)


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
            model_path=agent_model_dir(config, i, path),
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
        colocated=config.trainer.offload == "idle_agents",
        bucket_mb=config.rollout.weight_sync_bucket_mb,
        weight_transfer=weight_transfer,
        **learner_factory,
    )
