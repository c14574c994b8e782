"""KL(π_θ ‖ π_cur): exact, k3, per-sequence, quantile, and the level an outcome certifies."""

import math

import pytest
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satseq.algo.binomial import binomial_cdf, clopper_pearson_upper
from satseq.algo.kl import (
    certified_alpha,
    kl_exact,
    kl_k3,
    kl_quantile,
    sequence_kl,
    units_to_certify,
)
from satseq.algo.logprobs import token_logprobs


def test_exact_kl_by_hand_and_direction():
    # π_θ = (0.5, 0.5), π_cur = (0.75, 0.25): KL(π_θ‖π_cur) = 0.5 ln(2/3) + 0.5 ln 2 = 0.143841
    logits_theta = torch.tensor([[[0.0, 0.0]]])
    logits_cur = torch.tensor([[[math.log(3.0), 0.0]]])
    assert kl_exact(logits_theta, logits_cur).item() == pytest.approx(0.143841, abs=1e-6)
    # the other direction, 0.75 ln 1.5 + 0.25 ln 0.5 = 0.130812, must not be what we compute
    assert kl_exact(logits_cur, logits_theta).item() == pytest.approx(0.130812, abs=1e-6)


def test_exact_kl_uses_temperature():
    logits_theta = torch.tensor([[[0.0, 0.0]]])
    logits_cur = torch.tensor([[[2 * math.log(3.0), 0.0]]])  # at T = 2 this is the case above
    assert kl_exact(logits_theta, logits_cur, temperature=2.0).item() == pytest.approx(
        0.143841, abs=1e-6
    )


def test_k3_estimates_exact_kl_on_samples_from_theta():
    g = torch.Generator().manual_seed(0)
    logits_theta, logits_cur = torch.randn(1, 1, 5, generator=g), torch.randn(1, 1, 5, generator=g)
    probs = torch.softmax(logits_theta[0, 0], -1)
    tokens = torch.multinomial(probs, 200_000, replacement=True, generator=g).view(1, -1)
    logp_theta = token_logprobs(logits_theta.expand(1, tokens.shape[1], 5), tokens)
    logp_cur = token_logprobs(logits_cur.expand(1, tokens.shape[1], 5), tokens)
    k3 = kl_k3(logp_theta, logp_cur)
    assert torch.all(k3 >= 0)
    assert k3.mean().item() == pytest.approx(kl_exact(logits_theta, logits_cur).item(), rel=0.03)


def test_token_logprobs_by_hand():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert token_logprobs(logits, torch.tensor([[1]])).item() == pytest.approx(math.log(0.75))
    assert token_logprobs(
        logits, torch.tensor([[1]]), temperature=math.inf
    ).item() == pytest.approx(math.log(0.5))


def test_sequence_kl_is_masked_mean():
    per_token = torch.tensor([[0.2, 0.4, 7.0], [0.1, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert torch.allclose(sequence_kl(per_token, mask), torch.tensor([0.3, 0.1]))


def test_quantile_by_hand():
    seq_kl = torch.tensor([0.5, 0.1, 0.3, 0.2, 0.4])
    assert kl_quantile(seq_kl, alpha=0.25) == pytest.approx(0.4)  # 0.75 quantile: index 3 of sorted
    assert kl_quantile(seq_kl, alpha=0.1) == pytest.approx(0.46)  # index 3.6 → 0.4 + 0.6·0.1
    assert kl_quantile(seq_kl, alpha=0.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="alpha"):
        kl_quantile(seq_kl, alpha=1.5)


def test_clopper_pearson_by_hand_and_against_scipy():
    # k = 0: 1 − η^(1/n); the maximum over N = 128 units certifies 0.023 (design §4)
    assert clopper_pearson_upper(0, 128, 0.05) == pytest.approx(1 - 0.05 ** (1 / 128))
    assert clopper_pearson_upper(0, 128, 0.05) == pytest.approx(0.023132, abs=1e-6)
    # k = 1 of 2 at η = 0.05: P(X ≤ 1) = 1 − p² = 0.05 → p = sqrt(0.95)
    assert clopper_pearson_upper(1, 2, 0.05) == pytest.approx(math.sqrt(0.95), abs=1e-12)
    assert clopper_pearson_upper(5, 5, 0.05) == 1.0
    for k, n, eta in [(3, 40, 0.05), (17, 96, 0.01), (1, 12, 0.2), (250, 1000, 0.05)]:
        expected = scipy.stats.beta.ppf(1 - eta, k + 1, n - k)
        assert clopper_pearson_upper(k, n, eta) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="eta"):
        clopper_pearson_upper(1, 10, 1.0)
    with pytest.raises(ValueError, match="k <= n"):
        clopper_pearson_upper(11, 10, 0.05)


def test_units_to_certify_by_hand():
    # ⌈ln 0.05 / ln 0.99⌉ = ⌈298.07⌉ = 299: sat_seq.yaml's α 0.01 needs 299 prompts an agent
    assert units_to_certify(0.01, 0.05) == 299
    assert units_to_certify(0.1, 0.05) == 29  # ⌈28.43⌉
    for alpha, eta in [(0.01, 0.05), (0.1, 0.05), (0.2, 0.5)]:
        n = units_to_certify(alpha, eta)
        assert clopper_pearson_upper(0, n, eta) <= alpha < clopper_pearson_upper(0, n - 1, eta)


def test_certified_alpha_counts_prompts_not_sequences():
    """Two prompts of three sequences: prompt 7 has one sequence above target, prompt 3 none →
    k = 1 of n = 2 units (not 1 of 6 sequences); a NaN KL (weights not finite) counts above."""
    seq_kl = torch.tensor([0.01, 0.2, 0.0, 0.01, 0.02, 0.03])
    units = torch.tensor([7, 7, 7, 3, 3, 3])
    assert certified_alpha(seq_kl, units, 0.05, 0.05) == pytest.approx(math.sqrt(0.95))
    assert certified_alpha(seq_kl, units, 0.5, 0.05) == pytest.approx(1 - 0.05**0.5)
    seq_kl[4] = math.nan
    assert certified_alpha(seq_kl, units, 0.5, 0.05) == pytest.approx(math.sqrt(0.95))


def test_certified_alpha_covers_on_correlated_prompts():
    """Simulated checks: each prompt's G = 8 sequences share its KL level (correlated), a share
    p = 0.06 of prompts have sequences above target. At η = 0.1 the level certified from 40
    prompts is ≥ p in ≥ 90 % of the stages; counting the 320 sequences as units (the old
    reading) it is not: the units matter."""
    generator = torch.Generator().manual_seed(0)
    p, n, G, eta, stages = 0.06, 40, 8, 0.1, 2000
    by_prompt = by_sequence = 0
    for _ in range(stages):
        shifted = torch.rand(n, generator=generator) < p  # the prompt's level is above target
        level = torch.where(shifted, 0.1, 0.01).repeat_interleave(G)
        seq_kl = level * (0.6 + 0.8 * torch.rand(n * G, generator=generator))
        units = torch.arange(n).repeat_interleave(G)
        by_prompt += certified_alpha(seq_kl, units, 0.05, eta) >= p
        by_sequence += certified_alpha(seq_kl, torch.arange(n * G), 0.05, eta) >= p
    assert by_prompt / stages >= 1 - eta
    assert by_sequence / stages < 1 - eta


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.data(), st.floats(0.001, 0.5))
def test_clopper_pearson_is_the_exact_binomial_bound(n, data, eta):
    """At the bound, P(X ≤ k) = η (k < n); it grows with k and with confidence (smaller η)."""
    k = data.draw(st.integers(0, n))
    upper = clopper_pearson_upper(k, n, eta)
    assert k / n <= upper <= 1.0
    if k < n:
        assert binomial_cdf(k, n, upper) == pytest.approx(eta, rel=1e-6, abs=1e-12)
        assert clopper_pearson_upper(k + 1, n, eta) >= upper
        assert clopper_pearson_upper(k, n, eta / 2) >= upper


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=40), st.floats(0, 1), st.floats(0, 1))
def test_quantile_is_monotone_in_alpha(values, a1, a2):
    seq_kl = torch.tensor(values, dtype=torch.float64)
    lo, hi = sorted((a1, a2))
    assert kl_quantile(seq_kl, hi) <= kl_quantile(seq_kl, lo) + 1e-9
