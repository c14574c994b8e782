"""KL(π_θ ‖ π_cur) per token and per sequence, its quantile and the level an outcome certifies
(design §4 trust region).

Direction: the divergence is taken from the policy being optimised, π_θ, to the stage-start
policy π_cur, i.e. KL(π_θ ‖ π_cur) = E_{π_θ}[log π_θ − log π_cur]. This is the mode-seeking
direction that the SAT-Seq trust region and penalty are stated in: it is large when π_θ puts
mass where π_cur had little, which is exactly the occupancy shift the theorem pays for.
"""

from __future__ import annotations

import math

import torch

from satseq.algo.binomial import clopper_pearson_upper
from satseq.algo.logprobs import vocabulary_logprobs
from satseq.algo.masks import masked_mean


def kl_exact(
    logits_theta: torch.Tensor, logits_cur: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Exact per-state KL(π_θ ‖ π_cur) = Σ_v π_θ(v) (log π_θ(v) − log π_cur(v)).

    logits_theta, logits_cur [B, T, V] → [B, T]. Preferred where the [B, T, V] tensors fit.
    """
    return kl_exact_from_logprobs(
        vocabulary_logprobs(logits_theta, temperature), vocabulary_logprobs(logits_cur, temperature)
    )


def kl_exact_from_logprobs(logp_theta: torch.Tensor, logp_cur: torch.Tensor) -> torch.Tensor:
    """`kl_exact` from vocabulary log-probs [B, T, V] already at the temperature → [B, T]."""
    return (logp_theta.exp() * (logp_theta - logp_cur)).sum(-1)


def kl_k3(logp_theta: torch.Tensor, logp_cur: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π_θ ‖ π_cur) on sampled tokens: ρ − 1 − log ρ, ρ = π_cur/π_θ.

    [B, T] → [B, T], always ≥ 0. It is unbiased when the tokens are drawn from π_θ; ours are drawn
    from π_cur, which equals π_θ when an agent's update starts, so inside the trust region the
    bias is second order. Use it when the vocabulary is too large for `kl_exact`.
    """
    log_rho = logp_cur - logp_theta
    return torch.exp(log_rho) - 1.0 - log_rho


def sequence_kl(per_token_kl: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence KL: mean over the sequence's masked tokens of the per-state KL, [B, T] → [B]."""
    return masked_mean(per_token_kl, mask, dim=-1)


def kl_quantile(seq_kl: torch.Tensor, alpha: float) -> float:
    """q, the in-sample (1 − α) quantile (linear interpolation) of the per-sequence KLs [N]: the
    trust region accepts when q ≤ target_kl (the seeds' rule, design §4). What an outcome
    certifies beyond the sample is `certified_alpha`."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"quantile alpha must be in [0, 1], got {alpha}")
    return float(torch.quantile(seq_kl.double(), 1.0 - alpha))


def certified_alpha(
    seq_kl: torch.Tensor, units: torch.Tensor, target_kl: float, eta: float
) -> float:
    """The level an update's KL outcome certifies (design §4 trust region): with confidence
    1 − η, a prompt drawn as these were has a sequence with KL(π_θ ‖ π_cur) > target_kl with
    probability at most this, so a sampled sequence exceeds target_kl at most as often.

    seq_kl [N]: per-sequence KLs; units [N]: each sequence's prompt (any ids). A prompt's G
    samples are correlated, so the prompts are the independent units: k of the n prompts have a
    sequence above target_kl, and the level is the exact binomial (Clopper–Pearson) upper bound
    on k/n. With k = 0 it is 1 − η^(1/n): n ≥ `units_to_certify(α, η)` prompts reach α.
    Valid for prompts θ was not fitted to (`kl_ctrl.measure_on: held_out`)."""
    ids, index = torch.unique(units, return_inverse=True)
    exceeds = (~(seq_kl <= target_kl)).long()  # a NaN KL (non-finite weights) is above
    above = torch.zeros(len(ids), dtype=torch.long, device=units.device)
    above = above.scatter_reduce(0, index, exceeds, "amax")
    return clopper_pearson_upper(int(above.sum()), len(ids), eta)


def units_to_certify(alpha: float, eta: float) -> int:
    """The fewest prompts whose outcome can certify α at confidence 1 − η (none above target):
    the smallest n with 1 − η^(1/n) ≤ α, i.e. n = ⌈ln η / ln(1 − α)⌉."""
    if not 0.0 < alpha < 1.0 or not 0.0 < eta < 1.0:
        raise ValueError(f"alpha and eta must be in (0, 1), got alpha={alpha}, eta={eta}")
    return math.ceil(math.log(eta) / math.log1p(-alpha) - 1e-9)
