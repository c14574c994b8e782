"""Stage recipes, one per `algorithm.name`: each reads like its algorithm in DESIGN §4."""

from __future__ import annotations

from typing import TYPE_CHECKING

from satseq.cluster.recipes.base import Recipe, StageResult

if TYPE_CHECKING:
    from satseq.cluster.coordinator import Coordinator


def make_recipe(runtime: Coordinator) -> Recipe:
    """The recipe `algorithm.name` selects, running on the coordinator's actors."""
    from satseq.cluster.recipes.grpo import GrpoRecipe
    from satseq.cluster.recipes.sat_seq import SatSeqRecipe
    from satseq.cluster.recipes.spo import SpoRecipe

    recipes = {"sat_seq": SatSeqRecipe, "spo": SpoRecipe, "grpo": GrpoRecipe}
    return recipes[runtime.config.algorithm.name](runtime)


__all__ = ["Recipe", "StageResult", "make_recipe"]
