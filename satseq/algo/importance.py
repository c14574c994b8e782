"""Truncated importance sampling for agents already updated in a stage (design §4)."""

from __future__ import annotations

import torch

from satseq.algo.masks import masked_sum


def truncated_is_weights(
    logp_hat: torch.Tensor,
    logp_cur: torch.Tensor,
    updated_mask: torch.Tensor,
    max_log_ratio: float,
) -> torch.Tensor:
    """c = min(1, exp(clamp(Σ_{t ∈ σ(1..k−1)} (logp̂_t − logp_cur_t), ±max_log_ratio))).

    logp_hat [B, T]: log-probs under the already-updated agents' new weights;
    logp_cur [B, T]: behaviour log-probs under the stage-start weights;
    updated_mask [B, T]: 1 on response tokens owned by agents σ(1..k−1).
    Returns c [B] in (0, 1]; a trajectory with no such tokens gets c = 1.
    """
    log_ratio = masked_sum(logp_hat - logp_cur, updated_mask, dim=-1)
    return torch.exp(log_ratio.clamp(-max_log_ratio, max_log_ratio)).clamp(max=1.0)
