"""Per-stage improvement certificates, in reward units (design §4).

Two forms:
- `theorem_terms`: the paper's Theorem 4.4/4.7 decomposition, logged as terms, never as a bound.
  With γ near 1 the penalties scale like 1/(1−γ)² and their sum is vacuous.
- `bandit_lower_bound`: single-turn generation is a contextual bandit, so
  J(π') − J(π) = E_{y∼π}[(w(y) − 1)(R(y) − b)], w = π'(y)/π(y), for any constant b.
  Its lower confidence bound at level 1 − δ_conf is informative at the sizes we train with.
  The unit of independence is the prompt: a prompt's G samples share it and are correlated, so
  the statistic is averaged over each prompt's samples first and n is the number of prompts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

Inequality = Literal["bernstein", "hoeffding"]


@dataclass(frozen=True)
class TheoremTerms:
    """The Theorem 4.4/4.7 terms of one agent's update (reward units); not a bound."""

    information_gain: float
    occupancy_shift: float
    estimator_bias: float
    finite_sample: float


def surrogate_gain(u: torch.Tensor, A: torch.Tensor, c: torch.Tensor) -> float:
    """L̂_i = Ê[c · (r − 1) · A], r = exp(u): the first-order (performance-difference) gain of
    agent i's step, IS-corrected for the agents updated before it. u, A, c: [N]. In float64:
    u sums a sequence's token log-ratios, and e^u overflows float32 past u ≈ 88 (NaN at A = 0).
    """
    return float((c.double() * torch.expm1(u.double()) * A.double()).mean())


def truncation_bias(log_ratio_prev: torch.Tensor, c: torch.Tensor, A_max: float) -> float:
    """ζ_i = A_max · Ê[|ρ − c|]: what truncating the earlier agents' ratio ρ to c can shift the
    IS-weighted advantage by. log_ratio_prev: [N] untruncated Σ (logp̂ − logp_cur); c: [N]."""
    return A_max * float((torch.exp(log_ratio_prev) - c).abs().mean())


def theorem_terms(
    surrogate: float,
    delta_i: float,
    A_max: float,
    gamma: float,
    zeta_i: float,
    N_i: int,
    n_agents: int,
    delta_conf: float,
    w_max: float,
) -> TheoremTerms:
    """The Theorem 4.4/4.7 terms for agent i, from held-out rows.

    information gain     L̂_i / (1 − γ)
    occupancy shift      2γ/(1 − γ)² · A_max · sqrt(δ_i / 2)   (δ_i: agent i's mean sequence KL,
                                                                what the Pinsker/CPI step needs)
    estimator bias       ζ_i / (1 − γ)
    finite sample        R/(1 − γ) · sqrt(log(2n/δ_conf) / (2 N_i)), R = 2·w_max·A_max, the range
                         of the estimated c·(r − 1)·A
    """
    horizon = 1.0 / (1.0 - gamma)
    value_range = 2.0 * w_max * A_max
    return TheoremTerms(
        information_gain=surrogate * horizon,
        occupancy_shift=2.0 * gamma * horizon**2 * A_max * math.sqrt(max(delta_i, 0.0) / 2.0),
        estimator_bias=zeta_i * horizon,
        finite_sample=value_range
        * horizon
        * math.sqrt(math.log(2 * n_agents / delta_conf) / (2 * max(N_i, 1))),
    )


def mean_lower_confidence(
    x: torch.Tensor, value_range: float, delta: float, inequality: Inequality
) -> float:
    """Radius ε with P(E[X] ≥ mean(x) − ε) ≥ 1 − δ, X i.i.d. in an interval of width `value_range`.

    bernstein: the empirical Bernstein bound (Maurer & Pontil 2009, Thm 4),
        ε = sqrt(2 V_n ln(2/δ) / n) + 7 R ln(2/δ) / (3 (n − 1)), V_n the unbiased sample variance.
    hoeffding: ε = R sqrt(ln(1/δ) / (2n)).
    """
    n = x.numel()
    if n < 2:
        return math.inf
    if inequality == "hoeffding":
        return value_range * math.sqrt(math.log(1.0 / delta) / (2 * n))
    V_n = float(x.double().var(unbiased=True))
    log_term = math.log(2.0 / delta)
    return math.sqrt(2.0 * V_n * log_term / n) + 7.0 * value_range * log_term / (3.0 * (n - 1))


@dataclass(frozen=True)
class BanditCertificate:
    estimate: float  # mean over prompts of each prompt's mean (w̄ − 1)(R − b)
    deviation: float  # PAC radius of that mean at δ_conf/2
    truncation_bias: float  # upper bound on what truncating w at w_max hides, at δ_conf/2
    n: int  # independent units: prompts

    @property
    def lower_bound(self) -> float:
        """With probability ≥ 1 − δ_conf: J(π') − J(π) ≥ lower_bound."""
        return self.estimate - self.deviation - self.truncation_bias


def bandit_lower_bound(
    log_w: torch.Tensor,
    R: torch.Tensor,
    b: float,
    R_min: float,
    R_max: float,
    w_max: float,
    delta_conf: float,
    inequality: Inequality = "bernstein",
    prompts: torch.Tensor | None = None,
) -> BanditCertificate:
    """PAC lower bound on J(π') − J(π) from y_j ∼ π drawn independently of how π' was chosen.

    log_w [N]: log π'(y_j) − log π(y_j) over the whole sequence; R [N] in [R_min, R_max];
    b: a baseline fixed before the samples were drawn (e.g. the last stage's mean reward).
    prompts [N]: each row's prompt (any ids); the statistics are averaged per prompt and the
    prompts, drawn independently, are the n of the deviation terms. None: every row its own.

    The ratio is truncated, w̄ = min(w, w_max), so the estimator has the bounded range
    Hoeffding/Bernstein need. Truncation bias: since w ≥ w̄ and R − b ≥ R_min − b,
        E[(w − w̄)(R − b)] ≥ −(b − R_min)₊ · E[w − w̄] = −(b − R_min)₊ · (1 − E[w̄]),
    using E_π[w] = 1 exactly; 1 − E[w̄] is bounded above with the same inequality. The two
    confidence statements share δ_conf by a union bound.
    """
    w_bar = torch.exp(log_w.double()).clamp(max=w_max)
    advantage = R.double() - b
    X = per_prompt_mean((w_bar - 1.0) * advantage, prompts)  # (w̄ − 1)(R − b), a prompt's mean
    w_bar = per_prompt_mean(w_bar, prompts)
    corners = [(wc - 1.0) * rc for wc in (0.0, w_max) for rc in (R_min - b, R_max - b)]
    X_range = max(corners) - min(corners)  # a mean of values in a range stays in it
    deviation = mean_lower_confidence(X, X_range, delta_conf / 2, inequality)
    w_deviation = mean_lower_confidence(w_bar, w_max, delta_conf / 2, inequality)
    truncated_mass = min(max(1.0 - float(w_bar.mean()) + w_deviation, 0.0), 1.0)  # ≥ 1 − E[w̄]
    return BanditCertificate(
        estimate=float(X.mean()),
        deviation=deviation,
        truncation_bias=max(b - R_min, 0.0) * truncated_mass,
        n=X.numel(),
    )


def per_prompt_mean(x: torch.Tensor, prompts: torch.Tensor | None) -> torch.Tensor:
    """x [N] averaged over the rows of each prompt → [n prompts] (first-seen order irrelevant:
    sorted ids); prompts None: x as it is."""
    if prompts is None:
        return x
    ids, index = torch.unique(prompts, return_inverse=True)
    sums = torch.zeros(len(ids), dtype=x.dtype).index_add_(0, index, x)
    counts = torch.zeros(len(ids), dtype=x.dtype).index_add_(0, index, torch.ones_like(x))
    return sums / counts
