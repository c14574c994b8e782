"""Coverage of the bandit bound when a prompt's G samples are correlated (DESIGN §4).

Each simulated stage draws n prompts. At every prompt π answers correctly with probability
p = 0.8; π' moves that probability by +shift or −shift with equal chance, plus `drift` (so the
true gain J(π') − J(π), over the prompts' distribution, is `drift`). The G samples of a prompt
share its move, so they are correlated. The bound at confidence 1 − δ must stay below the true
gain in at least 1 − δ of the stages: `coverage` counts how often it does, with the statistic
averaged per prompt (the certificate's unit of independence) or, as before, with every sample
taken as independent.

    .venv/bin/python bench/bench_certificate.py --coverage
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from satseq.algo import bandit_lower_bound

P_CORRECT, BASELINE, W_MAX, DELTA = 0.8, 0.2, 2.0, 0.05


@dataclass(frozen=True)
class Coverage:
    coverage: float  # share of stages whose bound ≤ the true gain
    positive: float  # share of stages whose bound > 0
    mean_bound: float


def simulated_stage(
    generator: torch.Generator, G: int, n: int, shift: float, drift: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log w [nG], R [nG], prompt [nG]) of one stage's held-out samples."""
    move = torch.where(torch.rand(n, generator=generator) < 0.5, shift, -shift) + drift
    prompt = torch.arange(n).repeat_interleave(G)
    correct = torch.rand(n * G, generator=generator) < P_CORRECT
    p_new = (P_CORRECT + move)[prompt]
    w = torch.where(correct, p_new / P_CORRECT, (1 - p_new) / (1 - P_CORRECT))
    return w.clamp_min(1e-12).log(), correct.double(), prompt


def coverage(
    G: int,
    n: int,
    shift: float = 0.2,
    drift: float = 0.0,
    stages: int = 2000,
    by_prompt: bool = True,
    seed: int = 0,
) -> Coverage:
    """How often the bound held (and was positive) over `stages` simulated stages."""
    generator = torch.Generator().manual_seed(seed)
    holds = positive = 0
    total = 0.0
    for _ in range(stages):
        log_w, R, prompt = simulated_stage(generator, G, n, shift, drift)
        bound = bandit_lower_bound(
            log_w,
            R,
            b=BASELINE,
            R_min=0.0,
            R_max=1.0,
            w_max=W_MAX,
            delta_conf=DELTA,
            prompts=prompt if by_prompt else None,
        ).lower_bound
        holds += bound <= drift
        positive += bound > 0
        total += bound
    return Coverage(holds / stages, positive / stages, total / stages)
