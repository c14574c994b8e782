"""What an update's optimiser steps and trust-region epochs measured (`update.py`'s records)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from satseq.algo.trust_region import StepOutcome


@dataclass
class StepStats:
    """One optimiser step (or a whole epoch's steps, combined)."""

    loss: float = 0.0
    clip_fraction: float = 0.0
    kl_penalty: float = 0.0
    ratio_max: float = 0.0
    steps: int = 0
    skipped: int = 0  # steps not taken: their gradient was not finite

    @staticmethod
    def mean(parts: list[StepStats]) -> StepStats:
        n = max(len(parts), 1)
        return StepStats(
            loss=sum(p.loss for p in parts) / n,
            clip_fraction=sum(p.clip_fraction for p in parts) / n,
            kl_penalty=sum(p.kl_penalty for p in parts) / n,
            ratio_max=max((p.ratio_max for p in parts), default=0.0),
            steps=sum(p.steps for p in parts),
            skipped=sum(p.skipped for p in parts),
        )


@dataclass(frozen=True)
class Attempt:
    """One attempt at an epoch: its steps' statistics and the KL check after them."""

    stats: StepStats
    kl_quantile: float
    logp_new: torch.Tensor | None  # [N, T] under the weights after the epoch, where measured
    sequence_kl: torch.Tensor | None  # [N]: each checked row's KL (+inf: not finite), else NaN


def kept_attempts(attempts: list[Attempt], epochs: list[StepOutcome]) -> list[Attempt]:
    """Each applied epoch's last attempt (the one whose weights were kept)."""
    kept, index = [], 0
    for outcome in epochs:
        index += len(outcome.kl_quantiles)
        if outcome.applied:
            kept.append(attempts[index - 1])
    return kept
