"""Stage-0 projection of an incoming agent (SAT paper, plug-and-play swap).

An agent of a trained team is replaced by a model π_pre that shares its tokenizer. Before the
SAT-Seq stages go on, π_pre is projected towards the outgoing agent's current policy π_cur, per
state, onto the geometric mixture

    π_λ(·|s) ∝ π_pre(·|s)^{1/(1+λ)} · π_cur(·|s)^{λ/(1+λ)},        λ ≥ 0,

with λ the smallest that keeps the mean per-state KL(π_λ ‖ π_cur) within the budget δ0 (λ = 0
gives π_pre, λ → ∞ gives π_cur). Writing t = 1/(1+λ), π_λ ∝ π_cur · exp(t·s) with
s = log π_pre − log π_cur, an exponential family in t, and d/dt KL(π_λ ‖ π_cur) = t·Var_{π_λ}(s)
≥ 0: the KL falls monotonically as λ grows, so bisection on t ∈ [0, 1] finds λ.

The chunked versions work from final hidden states and output layers (`satseq.algo.lm_head`),
so no [M, V] tensor exists beyond one chunk.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from satseq.algo.kl import kl_exact_from_logprobs
from satseq.algo.lm_head import DEFAULT_CHUNK_TOKENS, OutputLayer, map_chunks

BISECTION_ITERATIONS = 30
"""Halvings of t = 1/(1+λ): the returned λ's t is within 2^-30 of the boundary of the budget."""


def geometric_mixture(
    logp_pre: torch.Tensor, logp_cur: torch.Tensor, lam: float | torch.Tensor
) -> torch.Tensor:
    """log π_λ = (log π_pre + λ log π_cur)/(1+λ) − logsumexp(·), over the last dim.

    logp_pre, logp_cur [..., V] (normalised log-probs); lam a float or a tensor broadcastable
    to [..., 1]. Returns [..., V], normalised. (The projection: π_pre^{1/(1+λ)} π_cur^{λ/(1+λ)}.)
    """
    if bool(torch.as_tensor(lam).lt(0).any()):
        raise ValueError(f"the projection's λ must be ≥ 0, got {lam}")
    unnormalised = (logp_pre + lam * logp_cur) / (1.0 + lam)
    return unnormalised - torch.logsumexp(unnormalised, dim=-1, keepdim=True)


def mixture_kl_to_current(
    logp_pre: torch.Tensor, logp_cur: torch.Tensor, lam: float | torch.Tensor
) -> torch.Tensor:
    """Per-state KL(π_λ ‖ π_cur), [..., V] → [...] (the projection's constraint)."""
    return kl_exact_from_logprobs(geometric_mixture(logp_pre, logp_cur, lam), logp_cur)


def projection_lambda(
    kl_at: Callable[[float], float], delta0: float, iterations: int = BISECTION_ITERATIONS
) -> float:
    """The smallest λ ≥ 0 (to the bisection's precision) with kl_at(λ) ≤ δ0, where kl_at(λ) is
    the mean per-state KL(π_λ ‖ π_cur), non-increasing in λ; λ = 0 if π_pre already meets δ0.

    Bisects t = 1/(1+λ) on [0, 1] (t = 0 is π_cur, KL 0) and returns λ = (1 − t)/t for the
    largest t found that meets the budget, so the returned λ always meets it (budget: KL ≤ δ0).
    """
    if delta0 <= 0:
        raise ValueError(f"the projection's KL budget δ0 must be > 0, got {delta0}")
    if kl_at(0.0) <= delta0:
        return 0.0
    t_meets, t_violates = 0.0, 1.0
    for _ in range(iterations):
        t = (t_meets + t_violates) / 2
        if kl_at((1.0 - t) / t) <= delta0:
            t_meets = t
        else:
            t_violates = t
    if t_meets == 0.0:
        raise ValueError(f"no λ meets δ0 = {delta0} within {iterations} halvings of 1/(1+λ)")
    return (1.0 - t_meets) / t_meets


def mean_mixture_kl(
    logp_pre: torch.Tensor, logp_cur: torch.Tensor, lam: float, mask: torch.Tensor | None = None
) -> float:
    """The mean over states (the True entries of `mask` [...], all if None) of KL(π_λ ‖ π_cur),
    from log-probs [..., V] (the bisection's kl_at for vectors held in memory)."""
    kl = mixture_kl_to_current(logp_pre, logp_cur, lam)
    return float(kl[mask].mean() if mask is not None else kl.mean())


def projection_lambda_from_logprobs(
    logp_pre: torch.Tensor, logp_cur: torch.Tensor, delta0: float
) -> float:
    """`projection_lambda` for log-prob vectors [..., V] held in memory."""
    return projection_lambda(lambda lam: mean_mixture_kl(logp_pre, logp_cur, lam), delta0)


# --- from hidden states, a chunk at a time --------------------------------------------------------


def chunked_mixture_kl(
    pre: OutputLayer,
    hidden_pre: torch.Tensor,
    cur: OutputLayer,
    hidden_cur: torch.Tensor,
    lam: float,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Per-state KL(π_λ ‖ π_cur) [M] from both models' hidden states [M, H_pre], [M, H_cur] at
    the same M states and their output layers; no gradient."""

    def chunk(h_pre: torch.Tensor, h_cur: torch.Tensor) -> torch.Tensor:
        return mixture_kl_to_current(
            pre.logprobs(h_pre, temperature), cur.logprobs(h_cur, temperature), lam
        )

    with torch.no_grad():
        return map_chunks(chunk, (hidden_pre, hidden_cur), chunk_tokens)


def chunked_distillation_kl(
    layer: OutputLayer,
    hidden: torch.Tensor,
    pre: OutputLayer,
    hidden_pre: torch.Tensor,
    cur: OutputLayer,
    hidden_cur: torch.Tensor,
    lam: float,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Per-state KL(π_λ ‖ π_θ) [M], the distillation loss towards the projection's target π_λ:
    π_θ from `hidden` [M, H] and `layer` (gradients flow into both), π_λ from π_pre's and
    π_cur's hidden states and output layers (constant). Checkpointed per chunk under autograd."""

    def chunk(h: torch.Tensor, h_pre: torch.Tensor, h_cur: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logp_target = geometric_mixture(
                pre.logprobs(h_pre, temperature), cur.logprobs(h_cur, temperature), lam
            )
        return kl_exact_from_logprobs(logp_target, layer.logprobs(h, temperature))

    return map_chunks(chunk, (hidden, hidden_pre, hidden_cur), chunk_tokens)
