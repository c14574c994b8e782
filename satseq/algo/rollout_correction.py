"""Rollout correction (design §12): the weight π_prox/π_behaviour between the learner's proximal
policy (logp_cur, the stage-start weights recomputed by the learner) and the policy the engine
sampled from (its reported log-probs), over each agent's own tokens.

It corrects whatever makes the two differ: staleness (`rollout.max_staleness` K ≥ 1, the engine
ran older weights) and the engine's numerics (another kernel, dtype or batch than the learner's,
which is never exactly 0 at K = 0). So it is one mechanism at every K, as verl's rollout
correction (TIS/MIS, Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training") and AReaL's decoupled PPO (Fu et al. 2025) apply it:

- level `token`: w_t = π_prox(y_t)/π_behaviour(y_t), for token-level losses (GRPO, SPO);
- level `sequence`: w = Π_t π_prox(y_t)/π_behaviour(y_t) over the response, for a sequence
  ratio (SAT-Seq);
- mode `truncate`: min(w, C) (truncated IS, TIS); mode `mask`: w where w ≤ C, else 0 (the
  term is dropped, MIS).

Unlike the earlier min(1, w) over a sequence, a weight above 1 is kept up to C: min(1, ·) only
ever shrinks, and its mean fell to 0.79 on SmolLM2 from rounding alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

CorrectionLevel = Literal["token", "sequence"]
CorrectionMode = Literal["truncate", "mask"]


@dataclass(frozen=True)
class RolloutCorrection:
    """The weights and what they say about the engine–learner mismatch.

    weights: [B, T] at token level (1 off the mask), [B] at sequence level (1 for a row with no
    token). mismatch: mean |logp_prox − logp_behaviour| over the masked tokens. weight_mean,
    weight_min, weight_max: of the applied weights over the terms (tokens or sequences with a
    token); capped_fraction: the terms whose raw ratio exceeded C."""

    weights: torch.Tensor
    mismatch: float
    weight_mean: float
    weight_min: float
    weight_max: float
    capped_fraction: float

    def metrics(self, prefix: str = "rollout/") -> dict[str, float]:
        return {
            f"{prefix}logprob_mismatch": self.mismatch,
            f"{prefix}correction_weight_mean": self.weight_mean,
            f"{prefix}correction_weight_min": self.weight_min,
            f"{prefix}correction_weight_max": self.weight_max,
            f"{prefix}correction_capped_fraction": self.capped_fraction,
        }


def rollout_correction(
    logp_prox: torch.Tensor,
    logp_behaviour: torch.Tensor,
    mask: torch.Tensor,
    level: CorrectionLevel,
    mode: CorrectionMode,
    cap: float,
) -> RolloutCorrection:
    """w = π_prox/π_behaviour (token or sequence level), truncated at or masked beyond C = cap.

    logp_prox, logp_behaviour, mask [B, T]: the learner's and the engine's log-probs of each
    sampled token, and 1 on the tokens a model wrote (each under its own agent's policy)."""
    if cap <= 1.0:
        raise ValueError(f"the correction's cap C must be > 1, got {cap}")
    delta = (logp_prox.double() - logp_behaviour.double()) * mask
    if level == "token":
        log_w, terms = delta, mask > 0  # log w_t = logp_prox,t − logp_behaviour,t
    elif level == "sequence":
        log_w, terms = delta.sum(-1), mask.sum(-1) > 0  # log w = Σ_t (logp_prox − logp_behaviour)
    else:
        raise ValueError(f"unknown correction level {level!r}: expected token or sequence")
    log_C = math.log(cap)
    capped = (log_w > log_C) & terms
    if mode == "truncate":
        w = torch.exp(log_w.clamp(max=log_C))  # min(w, C)
    elif mode == "mask":
        w = torch.where(capped, 0.0, torch.exp(log_w.clamp(max=log_C)))  # w·1[w ≤ C]
    else:
        raise ValueError(f"unknown correction mode {mode!r}: expected truncate or mask")
    w = torch.where(terms, w, 1.0)
    applied = w[terms]
    n_tokens = float(mask.sum())
    return RolloutCorrection(
        weights=w.float(),
        mismatch=float(delta.abs().sum()) / n_tokens if n_tokens else 0.0,
        weight_mean=float(applied.mean()) if applied.numel() else 1.0,
        weight_min=float(applied.min()) if applied.numel() else 1.0,
        weight_max=float(applied.max()) if applied.numel() else 1.0,
        capped_fraction=float(capped.sum()) / max(int(terms.sum()), 1),
    )
