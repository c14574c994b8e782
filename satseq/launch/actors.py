"""Starting the actors every command shares: rollout actors and the sandbox pool, and the two
together as a fleet that a command holds for its span (`rollout_fleet`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import ray

from satseq.actors.rollout import RolloutActor, spread_requests
from satseq.actors.trajectory import Generation, GenerationRequest, SamplingSpec
from satseq.actors.weight_transfer import TransferBackend
from satseq.config import RunConfig
from satseq.config.rollout import SandboxConfig
from satseq.launch.settings import engine_options, reward_scorer, sandbox_backend
from satseq.sandbox.pool import SandboxPoolActor
from satseq.seeds import rollout_actor_seed

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

    Actor j gets the Ray options `options(j)` and its seed (`satseq.seeds.rollout_actor_seed`);
    with a sandbox pool it runs the tool loop of `rollout.tools`. Each scores the samples of
    requests that carry a reference answer with the config's reward (design §3: rewards are
    computed in the rollout workers). With `weight_transfer`, the engines can take a collective
    weight sync on that backend (`satseq.actors.weight_transfer`).
    """
    options_of_engines = engine_options(config)
    if weight_transfer is not None:
        options_of_engines["weight_transfer"] = weight_transfer
    actors = [
        RolloutActor.options(**options(j)).remote(
            agent_paths,
            config.rollout.engine,
            options_of_engines,
            rollout_actor_seed(seed, j),
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


@dataclass
class RolloutFleet:
    """Rollout actors and, with tools, the sandbox pool their tool loops run code in."""

    actors: list[Any] = field(default_factory=list)
    sandbox: Any = None

    def generate(
        self, requests: list[GenerationRequest], spec: SamplingSpec
    ) -> list[list[Generation]]:
        """Requests dealt round-robin over the actors (`spread_requests`)."""
        return spread_requests(self.actors)(requests, spec)

    def sandbox_statuses(self) -> dict[str, int] | None:
        """The pool's execution counts by status so far; None without a sandbox."""
        if self.sandbox is None:
            return None
        return ray.get(self.sandbox.metrics.remote())["statuses"]


@contextmanager
def rollout_fleet(
    config: RunConfig, agent_paths: dict[str, str], seed: int, name_prefix: str | None = None
) -> Iterator[RolloutFleet]:
    """`rollout.num_actors` rollout actors on `agent_paths` (`start_rollout_actors`), after a
    sandbox pool of their own when `rollout.tools.enabled`, for the span of a `with` block:
    every one of them is killed on exit, also on an error. With `name_prefix` they are named
    `<prefix>-rollout-<j>` and `<prefix>-sandbox-pool`."""
    options = rollout_actor_options(config)  # the cluster is asked once
    fleet = RolloutFleet()
    try:
        if config.rollout.tools.enabled:
            name = f"{name_prefix}-sandbox-pool" if name_prefix else None
            fleet.sandbox = start_sandbox_pool(config.sandbox, name)
        fleet.actors = start_rollout_actors(
            config,
            agent_paths,
            seed,
            lambda j: options | ({"name": f"{name_prefix}-rollout-{j}"} if name_prefix else {}),
            sandbox=fleet.sandbox,
        )
        yield fleet
    finally:
        for actor in [*fleet.actors, *([fleet.sandbox] if fleet.sandbox is not None else [])]:
            ray.kill(actor)
