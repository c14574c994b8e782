"""Policy losses (design §4): sequence-ratio PPO with a KL penalty (SAT-Seq), token PPO with
clip-higher and dual-clip (SPO, GRPO).

Shapes: logp_theta, logp_cur, mask [B, T]; A [B] (one per trajectory); the weights c [B] (one
per trajectory: SAT-Seq's IS weights, a sequence-level rollout correction) or [B, T] (a
token-level rollout correction, for a token ratio).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from satseq.algo.masks import masked_mean

RatioMode = Literal["seq", "token", "seq_mean"]
Aggregation = Literal["token_mean", "seq_mean"]
MAX_LOG_RATIO = 20.0
"""Where r = e^u stops growing in a term whose loss is unbounded (A < 0 without dual-clip):
r = e^20 ≈ 4.9e8, far past any clip, finite in float32 with room for A and the sums."""


@dataclass(frozen=True)
class PolicyLoss:
    loss: torch.Tensor  # scalar to minimise
    clip_fraction: torch.Tensor  # share of terms where the clipped branch was active (0-dim)
    ratio_max: torch.Tensor  # largest r over the terms, 0 without any (0-dim)


def log_ratio(
    logp_theta: torch.Tensor, logp_cur: torch.Tensor, mask: torch.Tensor, mode: RatioMode
) -> torch.Tensor:
    """u, the log importance ratio: [B] for `seq` and `seq_mean`, [B, T] for `token`."""
    delta = (logp_theta - logp_cur) * mask
    if mode == "seq":
        return delta.sum(-1)  # u = Σ_{t ∈ agent i} (logp_θ − logp_cur)
    if mode == "seq_mean":
        return delta.sum(-1) / mask.sum(-1).clamp_min(1.0)  # u = length-normalised sum
    if mode == "token":
        return delta  # u_t = logp_θ,t − logp_cur,t
    raise ValueError(f"unknown ratio mode {mode!r}: expected seq, token or seq_mean")


def clipped_surrogate(
    u: torch.Tensor,
    A: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-term PPO-clip loss −min(r·A, exp(clip(u, log(1−ε_low), log(1+ε_high)))·A).

    With `dual_clip` = C (> 1), terms with A < 0 are further capped at −C·A (Ye et al. 2020).
    Returns (loss per term, bool mask of terms where clipping was active); u and A broadcast.

    r = e^u is taken at u capped where the unclipped branch cannot be chosen (above
    log(1+ε_high) for A ≥ 0, above log C for A < 0 with dual-clip), which changes no value or
    gradient and keeps r finite: a sequence ratio sums the log-ratios of hundreds of tokens and
    overflows float32 past u ≈ 88, and the chosen branch's backward then multiplies the other's
    infinite r by 0 (NaN). A < 0 without dual-clip is unbounded: u is capped at MAX_LOG_RATIO,
    past which the term is constant. The clip flags are compared in log space, uncapped.
    """
    lo, hi = math.log(1.0 - eps_low), math.log(1.0 + eps_high)
    log_C = math.log(dual_clip) if dual_clip is not None else MAX_LOG_RATIO
    u_cap = torch.full_like(A, hi, dtype=u.dtype).masked_fill(A < 0, log_C)
    u_clip = u.clamp(lo, hi)
    pg_loss1 = -A * torch.exp(torch.clamp(u, max=u_cap))
    pg_loss2 = -A * torch.exp(u_clip)
    pg_loss = torch.maximum(pg_loss1, pg_loss2)
    clipped = ((A > 0) & (u_clip < u)) | ((A < 0) & (u_clip > u))  # pg_loss2 > pg_loss1
    if dual_clip is not None:
        pg_loss3 = -A * dual_clip
        dual = (A < 0) & (torch.maximum(u, u_clip) > log_C)  # C·|A| < pg_loss
        pg_loss = torch.where(dual, pg_loss3, pg_loss)
        clipped = clipped | dual
    return pg_loss, clipped


def aggregate(per_term: torch.Tensor, mask: torch.Tensor, how: Aggregation) -> torch.Tensor:
    """Reduce a per-sequence [B] or per-token [B, T] loss over the masked tokens.

    token_mean: every token counts once (a sequence-level term counts once per token it owns).
    seq_mean: mean over sequences that own at least one token of their token-mean.
    """
    per_token = per_term.unsqueeze(-1).expand_as(mask) if per_term.dim() == 1 else per_term
    if how == "token_mean":
        return masked_mean(per_token, mask)
    if how == "seq_mean":
        has_tokens = (mask.sum(-1) > 0).to(mask.dtype)
        return masked_mean(masked_mean(per_token, mask, dim=-1), has_tokens)
    raise ValueError(f"unknown aggregation {how!r}: expected token_mean or seq_mean")


def policy_loss(
    logp_theta: torch.Tensor,
    logp_cur: torch.Tensor,
    A: torch.Tensor,
    mask: torch.Tensor,
    c: torch.Tensor | None = None,
    ratio: RatioMode = "seq",
    eps_low: float = 0.2,
    eps_high: float | None = None,
    dual_clip: float | None = None,
    aggregation: Aggregation = "seq_mean",
) -> PolicyLoss:
    """−E[c · min(r·A, clip(r)·A)] over agent i's tokens (`mask`), c defaulting to 1 (per
    trajectory [B], or per token [B, T] with ratio="token").

    SAT-Seq: ratio="seq", aggregation="seq_mean", eps_high=eps_low.
    SPO: ratio="token", eps_low=0.2, eps_high=0.28, dual_clip=10, aggregation="token_mean".
    """
    if c is None:
        c = torch.ones_like(A)
    u = log_ratio(logp_theta, logp_cur, mask, ratio)
    if ratio == "token":
        A_b, c_b = A.unsqueeze(-1), (c if c.dim() == 2 else c.unsqueeze(-1))
        term_mask = mask
    elif c.dim() == 2:
        raise ValueError(f"per-token weights c [B, T] need ratio 'token', not {ratio!r}")
    else:
        A_b, c_b = A, c
        term_mask = (mask.sum(-1) > 0).to(mask.dtype)
    pg_loss, clipped = clipped_surrogate(
        u, A_b, eps_low, eps_high if eps_high is not None else eps_low, dual_clip
    )
    loss = aggregate(c_b * pg_loss, mask, aggregation)
    with torch.no_grad():  # left on u's device: the caller reads them back when it needs to
        clip_fraction = masked_mean(clipped.to(mask.dtype), term_mask)
        ratios = torch.where(term_mask > 0, torch.exp(u), 0.0)
        ratio_max = ratios.amax() if ratios.numel() else ratios.new_zeros(())
    return PolicyLoss(loss, clip_fraction, ratio_max)


def kl_penalty(
    per_token_kl: torch.Tensor, mask: torch.Tensor, beta: float, aggregation: Aggregation
) -> torch.Tensor:
    """β_i · KL(π_θ ‖ π_cur) over agent i's tokens, per_token_kl [B, T], aggregated exactly as
    the policy loss (design §4): with the same per-sequence or per-token weights, a step is the
    same however its mini-batch is cut into micro-batches."""
    return beta * aggregate(per_token_kl, mask, aggregation)
