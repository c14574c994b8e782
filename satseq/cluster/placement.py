"""Where actors run: one placement group for the whole team, built here and only here.

Bundles: one per learner (a GPU when the cluster has one and the config asks for it, CPU
otherwise), then one per rollout actor. The coordinator itself takes no resources.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from satseq.config import RunConfig
from satseq.config.schema import EngineResources

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TeamPlacement:
    group: PlacementGroup
    n_learners: int
    learner_gpus: float
    rollout_gpus: float

    @property
    def learner_device(self) -> str:
        return "cuda" if self.learner_gpus > 0 else "cpu"

    def learner_options(self, index: int) -> dict[str, Any]:
        return self._options(index, self.learner_gpus)

    def learner_threads(self, index: int) -> int:
        """Torch threads for learner `index` (`learner_threads` over where the bundles are)."""
        nodes = placement_group_table(self.group)["bundles_to_node_id"]
        cpus = [bundle.get("CPU", 0.0) for bundle in self.group.bundle_specs]
        return learner_threads(cpus, [nodes[b] for b in range(len(cpus))], self.n_learners)[index]

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
    bundle_cpus: list[float], bundle_nodes: list[str], n_learners: int
) -> list[int]:
    """Torch threads per learner (the first `n_learners` bundles): the CPUs of the team's
    bundles on its node, shared evenly by the learners there; at least 1.

    A stage's phases never overlap (generation, then the learners' passes, then generation
    again), so while the learners work the rollout actors' CPUs are idle and theirs to use.
    """
    threads = []
    for node in bundle_nodes[:n_learners]:
        cpus = sum(c for c, n in zip(bundle_cpus, bundle_nodes, strict=True) if n == node)
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


def place_team(config: RunConfig, timeout_s: float = 120.0) -> TeamPlacement:
    """Reserve the team's resources, or fail with what is missing."""
    cluster_has_gpu = ray.cluster_resources().get("GPU", 0) > 0
    learners = [
        _bundle(config.trainer.resources, cluster_has_gpu, "a learner") for _ in config.team.agents
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
            "trainer.resources / rollout.resources or rollout.num_actors."
        )
    return TeamPlacement(
        group, len(learners), learners[0].get("GPU", 0.0), rollouts[0].get("GPU", 0.0)
    )
