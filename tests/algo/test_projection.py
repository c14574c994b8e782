"""The Stage-0 projection of an incoming agent: the geometric mixture π_λ, its KL to π_cur, the
bisection on λ, the chunked forms, and a toy policy enumerated exactly."""

import itertools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from satseq.algo.kl import kl_exact_from_logprobs
from satseq.algo.lm_head import OutputLayer
from satseq.algo.logprobs import token_logprobs
from satseq.algo.projection import (
    chunked_distillation_kl,
    chunked_mixture_kl,
    geometric_mixture,
    mean_mixture_kl,
    mixture_kl_to_current,
    projection_lambda,
    projection_lambda_from_logprobs,
)


def _log(*probs: float) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log()


PRE, CUR = _log(0.8, 0.2), _log(0.2, 0.8)


def test_mixture_by_hand():
    # λ = 1: ∝ (√(0.8·0.2), √(0.2·0.8)) = (0.5, 0.5)
    torch.testing.assert_close(geometric_mixture(PRE, CUR, 1.0).exp(), _log(0.5, 0.5).exp())
    # λ = 3: π_0/π_1 = 4^{1/4} · (1/4)^{3/4} = 1/2 → (1/3, 2/3)
    torch.testing.assert_close(geometric_mixture(PRE, CUR, 3.0).exp(), _log(1 / 3, 2 / 3).exp())
    # KL((½, ½) ‖ (0.2, 0.8)) = ½ ln 2.5 + ½ ln 0.625 = ln 1.25
    assert float(mixture_kl_to_current(PRE, CUR, 1.0)) == pytest.approx(math.log(1.25))
    # KL(π_pre ‖ π_cur) at λ = 0 = 0.8 ln 4 + 0.2 ln ¼ = 0.6 ln 4
    assert float(mixture_kl_to_current(PRE, CUR, 0.0)) == pytest.approx(0.6 * math.log(4))


def test_mixture_is_per_state_over_the_last_dim():
    pre = torch.stack([PRE, _log(0.5, 0.5)])
    cur = torch.stack([CUR, _log(0.5, 0.5)])
    mixed = geometric_mixture(pre, cur, torch.tensor([[1.0], [3.0]], dtype=torch.float64))
    torch.testing.assert_close(mixed[0].exp(), _log(0.5, 0.5).exp())
    torch.testing.assert_close(mixed[1].exp(), _log(0.5, 0.5).exp())  # equal inputs stay put


def test_negative_lambda_and_empty_budget_are_refused():
    with pytest.raises(ValueError, match="λ must be ≥ 0"):
        geometric_mixture(PRE, CUR, -0.5)
    with pytest.raises(ValueError, match="δ0 must be > 0"):
        projection_lambda(lambda lam: 1.0, 0.0)


def test_bisection_by_hand():
    # the KL of λ = 1 is ln 1.25: with that budget the bisection lands on λ = 1
    lam = projection_lambda_from_logprobs(PRE, CUR, math.log(1.25))
    assert lam == pytest.approx(1.0, rel=1e-6)
    assert float(mixture_kl_to_current(PRE, CUR, lam)) <= math.log(1.25)
    assert projection_lambda_from_logprobs(PRE, CUR, 0.6 * math.log(4)) == 0.0  # π_pre meets it
    # the budget over two states is their mean: (ln 1.25 + 0)/2 at λ = 1
    pre, cur = torch.stack([PRE, CUR]), torch.stack([CUR, CUR])
    assert projection_lambda_from_logprobs(pre, cur, math.log(1.25) / 2) == pytest.approx(1.0)


logits = st.lists(st.floats(-6, 6, allow_nan=False, allow_infinity=False), min_size=2, max_size=6)


def _pair(first: list[float], second: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    V = min(len(first), len(second))
    as_logp = lambda values: torch.tensor(values[:V], dtype=torch.float64).log_softmax(-1)  # noqa: E731
    return as_logp(first), as_logp(second)


@settings(max_examples=200, deadline=None)
@given(logits, logits, st.lists(st.floats(0, 1e3), min_size=2, max_size=8))
def test_kl_to_current_is_non_increasing_in_lambda(first, second, lambdas):
    logp_pre, logp_cur = _pair(first, second)
    kls = [float(mixture_kl_to_current(logp_pre, logp_cur, lam)) for lam in sorted(lambdas)]
    for earlier, later in itertools.pairwise(kls):
        assert later <= earlier + 1e-12


@settings(max_examples=200, deadline=None)
@given(logits, logits, st.floats(0, 1e4))
def test_mixture_is_a_distribution_and_lambda_zero_is_pi_pre(first, second, lam):
    logp_pre, logp_cur = _pair(first, second)
    probs = geometric_mixture(logp_pre, logp_cur, lam).exp()
    assert torch.all(probs >= 0)
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(geometric_mixture(logp_pre, logp_cur, 0.0), logp_pre)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(logits, min_size=1, max_size=4),
    st.lists(logits, min_size=1, max_size=4),
    st.floats(1e-4, 2.0),
)
def test_bisection_meets_the_budget_and_is_the_smallest_lambda(firsts, seconds, delta0):
    V = min(len(x) for x in firsts + seconds)
    n = min(len(firsts), len(seconds))
    logp_pre = torch.tensor([x[:V] for x in firsts[:n]], dtype=torch.float64).log_softmax(-1)
    logp_cur = torch.tensor([x[:V] for x in seconds[:n]], dtype=torch.float64).log_softmax(-1)
    lam = projection_lambda_from_logprobs(logp_pre, logp_cur, delta0)
    assert lam >= 0
    assert mean_mixture_kl(logp_pre, logp_cur, lam) <= delta0
    assume(lam > 1e-3)
    assert mean_mixture_kl(logp_pre, logp_cur, lam / 2) > delta0  # a smaller λ breaks it


def test_chunked_forms_match_full_vocabulary_tensors():
    g = torch.Generator().manual_seed(0)
    M, H, V = 7, 4, 5
    pre = OutputLayer(torch.randn(V, H, generator=g), torch.randn(V, generator=g))
    cur = OutputLayer(torch.randn(V, H, generator=g))
    theta = OutputLayer(torch.randn(V, H, generator=g).requires_grad_(True))
    h_pre, h_cur = torch.randn(M, H, generator=g), torch.randn(M, H, generator=g)
    h = torch.randn(M, H, generator=g, requires_grad=True)
    logp_pre, logp_cur = pre.logprobs(h_pre, 0.7), cur.logprobs(h_cur, 0.7)
    expected_kl = mixture_kl_to_current(logp_pre, logp_cur, 2.0)
    got_kl = chunked_mixture_kl(pre, h_pre, cur, h_cur, 2.0, 0.7, chunk_tokens=3)
    torch.testing.assert_close(got_kl, expected_kl)
    target = geometric_mixture(logp_pre, logp_cur, 2.0)
    expected = kl_exact_from_logprobs(target, theta.logprobs(h, 0.7))
    got = chunked_distillation_kl(theta, h, pre, h_pre, cur, h_cur, 2.0, 0.7, chunk_tokens=3)
    torch.testing.assert_close(got, expected)
    (grad_expected,) = torch.autograd.grad(expected.sum(), h)
    (grad_got,) = torch.autograd.grad(got.sum(), h)
    torch.testing.assert_close(grad_got, grad_expected)


# --- the toy: vocabulary 3, length 3, an autoregressive softmax table, enumerated exactly -------

V, L = 3, 3
BOS = V
SEQUENCES = torch.cartesian_prod(*[torch.arange(V)] * L)  # [27, 3]


def _state_logprobs(theta: torch.Tensor) -> torch.Tensor:
    """theta [L, V + 1, V] (logits of position t given the previous token) → log π(·|s_t) of
    every sequence's states, [27, L, V]."""
    previous = torch.cat([torch.full((len(SEQUENCES), 1), BOS), SEQUENCES[:, :-1]], dim=1)
    return theta[torch.arange(L), previous].log_softmax(-1)


def _sequence_logprobs(state_logprobs: torch.Tensor) -> torch.Tensor:
    """log π(y) of every sequence, [27, L, V] → [27]."""
    return token_logprobs(state_logprobs, SEQUENCES, temperature=1.0).sum(-1)


def test_toy_projection_meets_the_budget_and_moves_towards_pi_pre_as_delta0_grows():
    g = torch.Generator().manual_seed(3)
    theta_pre = 2 * torch.randn(L, V + 1, V, generator=g, dtype=torch.float64)
    theta_cur = 2 * torch.randn(L, V + 1, V, generator=g, dtype=torch.float64)
    logp_pre, logp_cur = _state_logprobs(theta_pre), _state_logprobs(theta_cur)
    # the states the team visits: π_cur's occupancy, exactly (each sequence's L states)
    occupancy = _sequence_logprobs(logp_cur).exp().unsqueeze(1) / L  # [27, 1], sums to 1

    def kl_at(lam: float) -> float:  # E_{s ~ π_cur} KL(π_λ(·|s) ‖ π_cur(·|s))
        return float((occupancy * mixture_kl_to_current(logp_pre, logp_cur, lam)).sum())

    def sequence_kl_to_pre(lam: float) -> float:  # KL(π_λ ‖ π_pre) over whole sequences
        log_new = _sequence_logprobs(geometric_mixture(logp_pre, logp_cur, lam))
        return float((log_new.exp() * (log_new - _sequence_logprobs(logp_pre))).sum())

    kl_pre = kl_at(0.0)
    lambdas, distances = [], []
    for delta0 in (0.02 * kl_pre, 0.1 * kl_pre, 0.3 * kl_pre, 0.7 * kl_pre, 1.5 * kl_pre):
        lam = projection_lambda(kl_at, delta0)
        assert kl_at(lam) <= delta0
        lambdas.append(lam)
        distances.append(sequence_kl_to_pre(lam))
    assert lambdas == sorted(lambdas, reverse=True) and lambdas[-1] == 0.0
    assert distances == sorted(distances, reverse=True) and distances[-1] == pytest.approx(0.0)
    assert distances[0] > distances[1] > distances[2] > distances[3]
