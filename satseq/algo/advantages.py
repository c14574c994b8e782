"""Advantage estimators (design §4): GRPO group normalisation, Dr.GRPO, GAE, SPO.

Shapes: `rewards` is [num_groups, G] for group estimators (G trajectories per prompt) and [B]
for SPO. Every estimator returns advantages with the input's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from satseq.algo.masks import masked_mean


@dataclass(frozen=True)
class GroupAdvantages:
    """Per-trajectory advantages [num_groups, G] plus the count of degenerate groups."""

    advantages: torch.Tensor
    degenerate_groups: int  # groups whose rewards were all equal: they get A = 0


def group_advantages(
    rewards: torch.Tensor,
    weights: torch.Tensor | None = None,
    normalize_std: bool = True,
    A_clip: float | None = None,
    eps: float = 1e-8,
    unbiased_std: bool = False,
) -> GroupAdvantages:
    """GRPO group advantage; Dr.GRPO when `normalize_std` is False.

    rewards [num_groups, G]; weights [num_groups, G] are the truncated IS weights c, which
    weight the group baseline (and the std) so that the baseline is estimated under the
    current team policy rather than the stage-start one. None means uniform weights.
    The std is the population one (SAT-Seq, eps 1e-8), or with `unbiased_std` the unbiased
    sample std (GRPO as verl computes it, eps 1e-6): Σ w (R − b)² / (1 − Σ w²) with the weights
    normalised, which is Σ (R − b)² / (G − 1) for uniform ones.
    """
    if weights is None:
        weights = torch.ones_like(rewards)
    w = weights / weights.sum(dim=-1, keepdim=True).clamp_min(eps)
    b = (w * rewards).sum(dim=-1, keepdim=True)  # b = Σ_j c_j R_j / Σ_j c_j (= mean_G R for c ≡ 1)
    A = rewards - b  # A = R − mean_G(R)
    if normalize_std:
        variance = (w * (rewards - b) ** 2).sum(dim=-1, keepdim=True)  # population variance
        if unbiased_std:
            variance = variance / (1.0 - (w**2).sum(dim=-1, keepdim=True)).clamp_min(eps)
        A = A / (variance.sqrt() + eps)  # A = (R − mean_G R) / (std_G R + eps)
    degenerate = (rewards == rewards[..., :1]).all(dim=-1)
    A = torch.where(degenerate.unsqueeze(-1), torch.zeros_like(A), A)
    if A_clip is not None:
        A = clip_advantages(A, A_clip)
    return GroupAdvantages(A, int(degenerate.sum()))


def clip_advantages(A: torch.Tensor, A_clip: float) -> torch.Tensor:
    """A ← clip(A, −A_clip, A_clip)."""
    return A.clamp(-A_clip, A_clip)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the masked tokens of each sequence.

    rewards, values, mask: [B, T]. Only tokens with mask 1 (the agent's own tokens) are steps
    of the recurrence: masked-out tokens (other agents' turns, tool output) are skipped, so the
    agent's tokens form one chain and V after its last token is 0 (terminal).
    Returns (advantages [B, T], returns [B, T]), zero where mask is 0.
      δ_t = r_t + γ V_{t'} − V_t  (t' = the agent's next token)
      A_t = δ_t + γ λ A_{t'}
    """
    B, T = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)
    next_advantage = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        A_t = delta + gamma * lam * next_advantage
        advantages[:, t] = A_t * m
        # Skipped tokens pass the successor's value and advantage through unchanged.
        next_value = torch.where(m > 0, values[:, t], next_value)
        next_advantage = torch.where(m > 0, A_t, next_advantage)
    returns = (advantages + values) * mask
    return advantages, returns


def terminal_rewards(R: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The sparse per-token rewards of `gae` mode, [B, T]: each trajectory's reward R [B] on
    the last token with mask 1 (the agent's own last token), zero elsewhere and on rows with
    no such token."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).max(dim=-1).values  # -1: the row has none
    rewards = torch.zeros(mask.shape, dtype=R.dtype, device=R.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    rewards[rows, last[rows]] = R[rows]
    return rewards


def gae_group_advantages(
    token_advantages: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    weights: torch.Tensor | None = None,
    A_clip: float | None = None,
    eps: float = 1e-8,
) -> GroupAdvantages:
    """`gae` mode's per-trajectory advantage: token-mean of GAE over the agent's tokens, then
    group-normalised and clipped like GRPO.

    token_advantages, mask: [num_groups * G, T], rows grouped contiguously by prompt.
    weights [num_groups * G]: the truncated IS weights c, as in `group_advantages`; a weight
    of 0 leaves a trajectory out of its group's baseline and std (one another agent wrote).
    """
    per_trajectory = masked_mean(token_advantages, mask, dim=-1)
    return group_advantages(
        per_trajectory.view(-1, group_size),
        weights=None if weights is None else weights.view(-1, group_size),
        A_clip=A_clip,
        eps=eps,
    )


def spo_advantages(r: torch.Tensor, p_hat: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """SPO: A = r − p̂ (p̂ before this step's tracker update), normalised over the batch [B].

    Uses the population std of the batch, like the group estimator.
    """
    A = r - p_hat
    return (A - A.mean()) / (A.std(unbiased=False) + eps)
