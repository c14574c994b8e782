"""Exact binomial tails and the Clopper–Pearson bound (the trust region's certified level)."""

from __future__ import annotations

import math


def clopper_pearson_upper(k: int, n: int, eta: float) -> float:
    """The exact one-sided upper confidence bound at 1 − η on a binomial proportion from k
    successes in n trials (Clopper & Pearson 1934): the p at which P(X ≤ k) = η, X ~ Bin(n, p)
    (the (1 − η) quantile of Beta(k + 1, n − k)); 1 when k = n or n = 0."""
    if not 0.0 < eta < 1.0:
        raise ValueError(f"the confidence eta must be in (0, 1), got {eta}")
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if k == n:
        return 1.0
    if k == 0:
        return -math.expm1(math.log(eta) / n)  # 1 − η^(1/n), exactly
    lo, hi = k / n, 1.0  # P(X ≤ k) falls from ≥ 1/2 at p = k/n (the median) to 0 at p = 1
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if binomial_cdf(k, n, mid) > eta else (lo, mid)
        if hi - lo < 1e-15:
            break
    return hi


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X ≤ k), X ~ Binomial(n, p), summed in log space (no overflow at large n)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    log_n = math.lgamma(n + 1)
    terms = [
        log_n - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * log_p + (n - j) * log_q
        for j in range(k + 1)
    ]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))
