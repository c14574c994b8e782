"""What a learner's calls return to the recipes: plain data, importable without Ray."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from satseq.algo.lm_head import OutputLayer
from satseq.algo.trust_region import StepOutcome


@dataclass(frozen=True)
class UpdateResult:
    """What one agent's update did. logp_hat [N, T]: log-probs of the batch under the weights
    the agent holds afterwards (the stage-start ones where every epoch was rejected); None, and
    kl_quantile NaN, where the epochs were not measured (`TrustRegionSpec.measure`).
    sequence_kl [N]: each row's KL(π_θ ‖ π_cur) under those weights, for the rows the check
    measured (NaN for the others, +inf where it is not finite); None where not measured or
    where no epoch ran (no training rows).
    steps: each epoch's trust-region outcome. loss, clip_fraction, kl_penalty (β·KL, mean over
    its optimiser steps) and ratio_max: of the last attempt of the last epoch.
    optimizer_steps: the optimiser steps of the epochs that were kept; skipped_steps: steps
    not taken in any attempt because their gradient was not finite.
    peak_memory_gib: the process's peak allocated device memory during the update, on CUDA;
    None elsewhere (`satseq.actors.residency.peak_memory_gib`). padding_fraction: the share of
    the positions a pass over the training batch computes that are padding, in the layout it
    runs (`satseq.actors.packing`)."""

    logp_hat: torch.Tensor | None
    steps: list[StepOutcome]
    loss: float
    clip_fraction: float
    tokens: int
    seconds: float
    peak_memory_gib: float | None = None
    sequence_kl: torch.Tensor | None = None
    kl_penalty: float = 0.0
    ratio_max: float = 0.0
    optimizer_steps: int = 0
    skipped_steps: int = 0
    padding_fraction: float = float("nan")

    @property
    def backtracks(self) -> int:
        return sum(step.backtracks for step in self.steps)

    @property
    def accepted_steps(self) -> int:
        return sum(step.applied for step in self.steps)

    @property
    def kl_quantile(self) -> float:
        """q of the last attempt of the last epoch."""
        return self.steps[-1].kl_quantiles[-1] if self.steps else 0.0


@dataclass(frozen=True)
class PolicyStates:
    """A policy at the agent's response states of a batch, as the exact KL needs it: its output
    layer and its last hidden states [M, H] at those M states (row-major over the trajectories'
    own response tokens), on the CPU. What a swap's incoming learner gets of π_cur."""

    layer: OutputLayer
    hidden: torch.Tensor


@dataclass(frozen=True)
class DistillResult:
    """What the Stage-0 projection did: λ of the target π_λ, the mean per-state
    KL(π_θ ‖ π_cur) before and after distilling towards it, and the optimiser steps taken."""

    lam: float
    kl_before: float
    kl: float
    steps: int
    met_budget: bool
