"""Coverage of the bandit bound when a prompt's G samples are correlated (design §4).

Prompts come from a pool of 4,096 with heterogeneous success rates p ~ U(0.02, 0.98) under π
(`rates`; (0.8, 0.8): every prompt alike).
π' moves each prompt's rate by +shift or −shift (a fixed random sign per prompt) plus `drift`,
kept within [0.01, 0.99]; the true gain J(π') − J(π) is the pool's mean move, computed exactly.
Each simulated stage draws n prompts from the pool and G samples of each: they share the
prompt's rate and its move, so they are correlated, and w = π'/π reaches past w_max where a
rare answer becomes common (p 0.05 → 0.25: w = 5), so the truncation term is exercised. The
bound at confidence 1 − δ must stay below the true gain in at least 1 − δ of the stages:
`coverage` counts how often it does, with the statistic averaged per prompt (the certificate's
unit of independence) or with every sample taken as independent; `slack_scale` < 1 shrinks the
bound's slack (deviation and truncation terms: a test's power check, the shrunk bound must fail
to cover).

    .venv/bin/python bench/bench_certificate.py --coverage
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from satseq.algo import bandit_lower_bound

POOL, BASELINE, W_MAX, DELTA = 4096, 0.2, 2.0, 0.05
RATES = (0.02, 0.98)


@dataclass(frozen=True)
class Coverage:
    coverage: float  # share of stages whose bound ≤ the true gain
    positive: float  # share of stages whose bound > 0
    mean_bound: float
    true_gain: float
    beyond_w_max: float  # share of the samples whose w exceeded w_max (truncated)


def prompt_pool(
    generator: torch.Generator, shift: float, drift: float, rates: tuple[float, float] = RATES
):
    """(p [POOL], p' [POOL]): each prompt's success rate under π (uniform over `rates`) and π'."""
    low, high = rates
    p = low + (high - low) * torch.rand(POOL, generator=generator, dtype=torch.float64)
    sign = torch.where(torch.rand(POOL, generator=generator) < 0.5, 1.0, -1.0).double()
    return p, (p + sign * shift + drift).clamp(0.01, 0.99)


def simulated_stage(
    generator: torch.Generator, p: torch.Tensor, p_new: torch.Tensor, G: int, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log w [nG], R [nG], prompt [nG]) of one stage's held-out samples."""
    drawn = torch.randint(POOL, (n,), generator=generator)
    prompt = torch.arange(n).repeat_interleave(G)
    rate, rate_new = p[drawn][prompt], p_new[drawn][prompt]
    correct = torch.rand(n * G, generator=generator, dtype=torch.float64) < rate
    w = torch.where(correct, rate_new / rate, (1 - rate_new) / (1 - rate))
    return w.log(), correct.double(), prompt


def coverage(
    G: int,
    n: int,
    shift: float = 0.2,
    drift: float = 0.0,
    stages: int = 2000,
    by_prompt: bool = True,
    seed: int = 0,
    slack_scale: float = 1.0,
    baseline: float = BASELINE,
    rates: tuple[float, float] = RATES,
) -> Coverage:
    """How often the bound held (and was positive) over `stages` simulated stages."""
    generator = torch.Generator().manual_seed(seed)
    p, p_new = prompt_pool(generator, shift, drift, rates)
    true_gain = float((p_new - p).mean())
    holds = positive = beyond = 0
    total = 0.0
    for _ in range(stages):
        log_w, R, prompt = simulated_stage(generator, p, p_new, G, n)
        cert = bandit_lower_bound(
            log_w,
            R,
            b=baseline,
            R_min=0.0,
            R_max=1.0,
            w_max=W_MAX,
            delta_conf=DELTA,
            prompts=prompt if by_prompt else None,
        )
        bound = cert.estimate - slack_scale * (cert.deviation + cert.truncation_bias)
        holds += bound <= true_gain
        beyond += int((log_w.exp() > W_MAX).sum())
        positive += bound > 0
        total += bound
    beyond_share = beyond / (stages * n * G)
    return Coverage(holds / stages, positive / stages, total / stages, true_gain, beyond_share)
