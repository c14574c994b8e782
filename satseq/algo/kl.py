"""KL(π_θ ‖ π_cur) per token and per sequence, and its quantile (DESIGN §4 trust region).

Direction: the divergence is taken from the policy being optimised, π_θ, to the stage-start
policy π_cur, i.e. KL(π_θ ‖ π_cur) = E_{π_θ}[log π_θ − log π_cur]. This is the mode-seeking
direction that the SAT-Seq trust region and penalty are stated in: it is large when π_θ puts
mass where π_cur had little, which is exactly the occupancy shift the theorem pays for.
"""

from __future__ import annotations

import math

import torch

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


def dkw_slack(N: int, eta: float) -> float:
    """ε(N, η) = sqrt(ln(2/η) / (2N)): with confidence 1 − η the empirical CDF of N i.i.d.
    samples is within ε of the true one everywhere (Dvoretzky–Kiefer–Wolfowitz, with Massart's
    constant)."""
    if not 0.0 < eta < 1.0:
        raise ValueError(f"the DKW confidence eta must be in (0, 1), got {eta}")
    return math.sqrt(math.log(2.0 / eta) / (2 * max(N, 1)))


def kl_quantile(seq_kl: torch.Tensor, alpha: float, dkw_eta: float | None = None) -> float:
    """q, the quantile of the per-sequence KLs [N] that the trust region checks (DESIGN §4).

    Without `dkw_eta`: the in-sample (1 − α) quantile (linear interpolation).
    With it: the empirical (1 − α + ε) quantile, ε = `dkw_slack(N, dkw_eta)`, taken as an order
    statistic x_(k) with F̂(x_(k)) ≥ 1 − α + ε, so that q ≤ target implies
    P(sequence KL > target) ≤ α with confidence 1 − η; when 1 − α + ε ≥ 1, q is the maximum.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"quantile alpha must be in [0, 1], got {alpha}")
    values = seq_kl.double()
    if dkw_eta is None:
        return float(torch.quantile(values, 1.0 - alpha))
    N = values.numel()
    level = 1.0 - alpha + dkw_slack(N, dkw_eta)
    k = min(max(math.ceil(level * N - 1e-9) - 1, 0), N - 1)  # 0-based rank: (k + 1)/N ≥ level
    return float(values.sort().values[k])
