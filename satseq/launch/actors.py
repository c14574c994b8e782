"""Starting the actors every command shares: rollout actors and the sandbox pool."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import ray

from satseq.actors.rollout import RolloutActor
from satseq.actors.weight_transfer import TransferBackend
from satseq.config import RunConfig
from satseq.config.schema import SandboxConfig
from satseq.launch.builders import engine_options, reward_scorer, sandbox_backend
from satseq.sandbox.pool import SandboxPoolActor

log = logging.getLogger(__name__)


def rollout_actor_options(config: RunConfig) -> dict:
    """Ray options of a rollout actor outside the training placement group: rollout.resources,
    on the CPU where the cluster has no GPU."""
    resources = config.rollout.resources
    num_gpus = resources.num_gpus
    if num_gpus > 0 and ray.cluster_resources().get("GPU", 0) == 0:
        log.warning("rollout.resources asks for %s GPU but the cluster has none: CPU", num_gpus)
        num_gpus = 0.0
    return {"num_cpus": resources.num_cpus, "num_gpus": num_gpus}


def start_rollout_actors(
    config: RunConfig,
    agent_paths: dict[str, str],
    seed: int,
    options: Callable[[int], dict],
    sandbox=None,
    weight_transfer: TransferBackend | None = None,
) -> list:
    """`rollout.num_actors` rollout actors, each with an engine per agent, started and ready.

    Actor j gets the Ray options `options(j)` and the seed `seed + 1000 j` (actors never share
    a random stream); with a sandbox pool it runs the tool loop of `rollout.tools`. Each scores
    the samples of requests that carry a reference answer with the config's reward (DESIGN §3:
    rewards are computed in the rollout workers). With `weight_transfer`, the engines can take
    a collective weight sync on that backend (`satseq.actors.weight_transfer`).
    """
    options_of_engines = engine_options(config)
    if weight_transfer is not None:
        options_of_engines["weight_transfer"] = weight_transfer
    actors = [
        RolloutActor.options(**options(j)).remote(
            agent_paths,
            config.rollout.engine,
            options_of_engines,
            seed + 1000 * j,
            tools=config.rollout.tools if sandbox is not None else None,
            sandbox=sandbox,
            scorer=reward_scorer(config),
        )
        for j in range(config.rollout.num_actors)
    ]
    ray.get([actor.ready.remote() for actor in actors])
    return actors


def start_sandbox_pool(sandbox: SandboxConfig, name: str | None = None):
    """The SandboxPool actor for tool calls (the `sandbox:` section), started: a sandbox below
    `sandbox.min_isolation` fails here, at start-up, not on the first tool call."""
    # stateless: Ray restarts it if it dies, and callers keep their handle
    options = {"num_cpus": 0, "max_restarts": -1} | ({"name": name} if name else {})
    pool = SandboxPoolActor.options(**options).remote(
        partial(sandbox_backend, sandbox), workers=sandbox.workers, queue_size=sandbox.queue_size
    )
    ray.get(pool.start.remote())
    return pool
