"""Where actors run: one placement group for the whole team, built here and only here.

Bundles: one per learner process (a GPU when the cluster has one and the config asks for it,
CPU otherwise): a rank of each agent's, where the LoRA agents of one base share a process one
(`learner_specs.learner_hosts`); then one per rollout actor. The coordinator itself takes no
resources.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from satseq.config import RunConfig
from satseq.config.rollout import EngineResources

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TeamPlacement:
    group: PlacementGroup
    learner_bundles: list[list[int]]  # agent i's ranks' bundles (agents of one host: the same)
    learner_gpus: float
    rollout_gpus: float
    overlapped: bool = False  # `TeamPlan.overlapped`: generation runs during updates

    @property
    def n_learners(self) -> int:
        """Learner bundles: one per learner process."""
        return _count(self.learner_bundles)

    @property
    def learner_device(self) -> str:
        return "cuda" if self.learner_gpus > 0 else "cpu"

    def learner_options(self, index: int, rank: int = 0) -> dict[str, Any]:
        """Ray options of agent `index`'s learner rank `rank`."""
        return self._options(self.learner_bundles[index][rank], self.learner_gpus)

    def learner_threads(self, index: int) -> int:
        """Torch threads for agent `index`'s learner ranks (`learner_threads` over where the
        bundles are)."""
        nodes = placement_group_table(self.group)["bundles_to_node_id"]
        cpus = [bundle.get("CPU", 0.0) for bundle in self.group.bundle_specs]
        where = [nodes[b] for b in range(len(cpus))]
        threads = learner_threads(cpus, where, self.n_learners, not self.overlapped)
        return threads[self.learner_bundles[index][0]]

    def rollout_options(self, index: int) -> dict[str, Any]:
        return self._options(self.n_learners + index, self.rollout_gpus)

    def _options(self, bundle: int, gpus: float) -> dict[str, Any]:
        cpus = self.group.bundle_specs[bundle].get("CPU", 0)
        return {
            "num_cpus": cpus,
            "num_gpus": gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=bundle
            ),
        }


def learner_threads(
    bundle_cpus: list[float],
    bundle_nodes: list[str],
    n_learners: int,
    with_rollout_cpus: bool = True,
) -> list[int]:
    """Torch threads per learner (the first `n_learners` bundles): the CPUs of the team's
    bundles on its node, shared evenly by the learners there; at least 1.

    In a synchronous stage the phases never overlap (generation, then the learners' passes,
    then generation again), so while the learners work the rollout actors' CPUs are idle and
    theirs to use; overlapped stages (`with_rollout_cpus` False) keep to the learners' own.
    """
    threads = []
    counted = len(bundle_cpus) if with_rollout_cpus else n_learners
    for node in bundle_nodes[:n_learners]:
        cpus = sum(
            c
            for c, n in zip(bundle_cpus[:counted], bundle_nodes[:counted], strict=True)
            if n == node
        )
        learners = bundle_nodes[:n_learners].count(node)
        threads.append(max(1, int(cpus / learners)))
    return threads


def _bundle(resources: EngineResources, cluster_has_gpu: bool, role: str) -> dict[str, float]:
    gpus = resources.num_gpus if cluster_has_gpu else 0.0
    if resources.num_gpus > 0 and not cluster_has_gpu:
        log.warning(
            "%s asks for %s GPU but the cluster has none: placing it on CPU",
            role,
            resources.num_gpus,
        )
    bundle = {"CPU": resources.num_cpus}
    if gpus > 0:
        bundle["GPU"] = gpus
    return bundle


def agent_bundles(hosts: list[list[int]], workers: list[int]) -> list[list[int]]:
    """Each agent's learner bundles, numbered in `hosts`' order: the agents of one host share
    its one bundle; an agent alone in its process has one per rank (`workers[i]`)."""
    bundles: list[list[int]] = [[] for _ in workers]
    start = 0
    for agents in hosts:
        ranks = workers[agents[0]] if len(agents) == 1 else 1
        for i in agents:
            bundles[i] = list(range(start, start + ranks))
        start += ranks
    return bundles


def _count(learner_bundles: list[list[int]]) -> int:
    return len({bundle for bundles in learner_bundles for bundle in bundles})


def place_team(
    config: RunConfig, hosts: list[list[int]] | None = None, timeout_s: float = 120.0
) -> TeamPlacement:
    """Reserve the team's resources, or fail with what is missing: a bundle per learner process
    of `hosts` (the agents each holds; default: a process each) and per rollout actor. A
    sharded agent's ranks get a bundle each, next to each other: PACK puts them on one node
    where they fit."""
    cluster_has_gpu = ray.cluster_resources().get("GPU", 0) > 0
    plan = config.plan
    workers = [learner.workers for learner in plan.agents]
    learner_bundles = agent_bundles(hosts or [[i] for i in range(len(workers))], workers)
    learners = [
        _bundle(config.trainer.resources, cluster_has_gpu, "a learner")
        for _ in range(_count(learner_bundles))
    ]
    rollouts = [
        _bundle(config.rollout.resources, cluster_has_gpu, "a rollout actor")
        for _ in range(config.rollout.num_actors)
    ]
    group = placement_group(learners + rollouts, strategy="PACK", name="satseq-team")
    if not group.wait(timeout_s):
        ray.util.remove_placement_group(group)
        raise RuntimeError(
            f"could not reserve {learners + rollouts} (learners, then rollout actors) within "
            f"{timeout_s:.0f} s; the cluster has {ray.cluster_resources()}. Lower "
            "trainer.resources / rollout.resources, rollout.num_actors or "
            f"trainer.workers_per_agent (learner ranks per agent: {workers})."
        )
    learner_gpus, rollout_gpus = learners[0].get("GPU", 0.0), rollouts[0].get("GPU", 0.0)
    overlapped = plan.overlapped
    if overlapped and (0 < learner_gpus < 1 or 0 < rollout_gpus < 1):
        ray.util.remove_placement_group(group)
        raise ValueError(
            f"rollout.max_staleness: {config.rollout.max_staleness} runs generation while the "
            f"learners update, but trainer.resources.num_gpus ({learner_gpus}) / "
            f"rollout.resources.num_gpus ({rollout_gpus}) share GPUs between them, and one "
            "GPU does not run both at once: give each whole GPUs, or set max_staleness: 0"
        )
    return TeamPlacement(group, learner_bundles, learner_gpus, rollout_gpus, overlapped)
