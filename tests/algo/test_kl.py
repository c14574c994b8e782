"""KL(π_θ ‖ π_cur): exact, k3, per-sequence, quantile."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satseq.algo.kl import dkw_slack, kl_exact, kl_k3, kl_quantile, sequence_kl
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


def test_dkw_slack_by_hand():
    # ε = sqrt(ln(2/η) / (2N)): η = 0.05, N = 128 → sqrt(3.68888 / 256) = 0.120040
    assert dkw_slack(128, 0.05) == pytest.approx(math.sqrt(math.log(40) / 256))
    assert dkw_slack(128, 0.05) == pytest.approx(0.120040, abs=1e-6)
    with pytest.raises(ValueError, match="eta"):
        dkw_slack(10, 1.0)


def test_dkw_quantile_is_an_order_statistic_with_the_slack():
    seq_kl = torch.arange(1, 201, dtype=torch.float64) / 100  # 0.01 … 2.00, sorted
    # N = 200, α = 0.1, η = 0.05: ε = sqrt(ln 40 / 400) = 0.09603, level 0.99603,
    # k + 1 = ceil(199.206) = 200: the maximum
    assert kl_quantile(seq_kl, alpha=0.1, dkw_eta=0.05) == 2.0
    # α = 0.2, η = 0.5: ε = sqrt(ln 4 / 400) = 0.05887, level 0.85887 → rank ceil(171.77) = 172
    assert kl_quantile(seq_kl, alpha=0.2, dkw_eta=0.5) == pytest.approx(1.72)
    # the in-sample quantile it replaces: 0.8 → index 159.2 → 1.602
    assert kl_quantile(seq_kl, alpha=0.2) == pytest.approx(1.602)


def test_small_samples_check_their_maximum():
    """At ~128 sequences, 1 − α + ε ≥ 1 for α = 0.1: the check is on the worst sequence."""
    seq_kl = torch.rand(128, generator=torch.Generator().manual_seed(0))
    assert kl_quantile(seq_kl, alpha=0.1, dkw_eta=0.05) == float(seq_kl.max())
    assert kl_quantile(seq_kl, alpha=0.1) < float(seq_kl.max())


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(0, 10), min_size=1, max_size=60),
    st.floats(0, 1),
    st.floats(0.01, 0.99),
)
def test_dkw_quantile_covers_its_level_and_bounds_the_in_sample_one(values, alpha, eta):
    """q is the smallest sample x with F̂(x) ≥ 1 − α + ε (the maximum when that is ≥ 1), so it
    is never below the in-sample empirical quantile min{x : F̂(x) ≥ 1 − α}. (Not the linearly
    interpolated one, which can lie above it: [0, 1] at α = ε = 0.94 gives q = 0 < 0.0625.)"""
    seq_kl = torch.tensor(values, dtype=torch.float64)
    q = kl_quantile(seq_kl, alpha, eta)
    N = len(values)

    def smallest_covering(level: float) -> float:  # min{x : N·F̂(x) ≥ N·level}, by counting
        return min(x for x in values if sum(v <= x for v in values) >= level * N - 1e-9)

    level = min(1 - alpha + dkw_slack(N, eta), 1.0)
    assert q == smallest_covering(level)
    assert float((seq_kl <= q).double().mean()) >= level - 1e-9
    assert q >= smallest_covering(1 - alpha)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 10), min_size=1, max_size=40), st.floats(0, 1), st.floats(0, 1))
def test_quantile_is_monotone_in_alpha(values, a1, a2):
    seq_kl = torch.tensor(values, dtype=torch.float64)
    lo, hi = sorted((a1, a2))
    assert kl_quantile(seq_kl, hi) <= kl_quantile(seq_kl, lo) + 1e-9
