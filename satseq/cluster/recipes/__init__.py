"""Stage recipes, one per `algorithm.name`: each reads like its algorithm in design §4."""

from __future__ import annotations

from satseq.cluster.learner_specs import LearnerSettings
from satseq.cluster.recipes.base import Recipe, StageResult
from satseq.cluster.recipes.grpo import GrpoRecipe
from satseq.cluster.recipes.sat_seq import SatSeqRecipe
from satseq.cluster.recipes.spo import SpoRecipe

RECIPES: dict[str, type] = {"sat_seq": SatSeqRecipe, "spo": SpoRecipe, "grpo": GrpoRecipe}
"""`algorithm.name` → its recipe class."""

__all__ = [
    "RECIPES",
    "GrpoRecipe",
    "LearnerSettings",
    "Recipe",
    "SatSeqRecipe",
    "SpoRecipe",
    "StageResult",
]
