"""Policy losses against hand values, a loop reference, and the clipping property."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satseq.algo.losses import (
    MAX_LOG_RATIO,
    aggregate,
    clipped_surrogate,
    kl_penalty,
    log_ratio,
    policy_loss,
)


def test_sequence_ratio_ppo_by_hand():
    # row 0: u = log 1.5 over two tokens, A = +1 → r = 1.5 clipped to 1.2 → term −1.2
    # row 1: u = log 0.5, A = −1 → −min(−0.5, −0.8) = 0.8
    half = math.log(1.5) / 2
    logp_theta = torch.tensor([[half, half, 9.0], [math.log(0.5), 0.0, 0.0]])
    logp_cur = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    A = torch.tensor([1.0, -1.0])
    out = policy_loss(logp_theta, logp_cur, A, mask, ratio="seq", eps_low=0.2)
    assert out.loss.item() == pytest.approx((-1.2 + 0.8) / 2, abs=1e-6)
    assert float(out.clip_fraction) == pytest.approx(1.0)
    assert float(out.ratio_max) == pytest.approx(1.5)  # row 0's r, before its clip
    # IS weights c = (1, 0.5) weight each trajectory's term
    weighted = policy_loss(logp_theta, logp_cur, A, mask, c=torch.tensor([1.0, 0.5]), ratio="seq")
    assert weighted.loss.item() == pytest.approx((-1.2 + 0.4) / 2, abs=1e-6)


def test_log_ratio_modes():
    logp_theta = torch.tensor([[0.2, 0.4, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    zeros = torch.zeros(1, 3)
    assert log_ratio(logp_theta, zeros, mask, "seq").item() == pytest.approx(0.6)
    assert log_ratio(logp_theta, zeros, mask, "seq_mean").item() == pytest.approx(0.3)
    assert torch.allclose(
        log_ratio(logp_theta, zeros, mask, "token"), torch.tensor([[0.2, 0.4, 0.0]])
    )
    with pytest.raises(ValueError, match="ratio mode"):
        log_ratio(logp_theta, zeros, mask, "bogus")


def _token_ppo_reference(logp_theta, logp_cur, A, mask, eps_low, eps_high, dual_clip):
    """Plain loops: verl-style token PPO with clip-higher and dual-clip, token-mean."""
    total, count = 0.0, 0
    for b in range(len(logp_theta)):
        for t in range(len(logp_theta[0])):
            if not mask[b][t]:
                continue
            r = math.exp(logp_theta[b][t] - logp_cur[b][t])
            unclipped = -A[b] * r
            clipped = -A[b] * min(max(r, 1 - eps_low), 1 + eps_high)
            loss = max(unclipped, clipped)
            if A[b] < 0:
                loss = min(loss, -A[b] * dual_clip)
            total += loss
            count += 1
    return total / count


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 10_000))
def test_token_ppo_dual_clip_matches_reference(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    logp_cur = -3 * torch.rand(B, T, generator=g)
    logp_theta = logp_cur + 3 * torch.randn(B, T, generator=g)  # big moves hit every branch
    A = 2 * torch.randn(B, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    mask[0, 0] = 1.0
    out = policy_loss(
        logp_theta,
        logp_cur,
        A,
        mask,
        ratio="token",
        eps_low=0.2,
        eps_high=0.28,
        dual_clip=10.0,
        aggregation="token_mean",
    )
    expected = _token_ppo_reference(
        logp_theta.tolist(), logp_cur.tolist(), A.tolist(), mask.tolist(), 0.2, 0.28, 10.0
    )
    assert out.loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-5)


@settings(max_examples=100, deadline=None)
@given(st.floats(-5, 5), st.floats(-10, 10), st.floats(0.01, 0.9), st.floats(0.01, 0.9))
def test_clipped_objective_never_exceeds_unclipped(u, A, eps_low, eps_high):
    # objective = −loss; for either sign of A the clipped objective is ≤ r·A
    loss, _ = clipped_surrogate(torch.tensor(u), torch.tensor(A), eps_low, eps_high)
    assert -loss.item() <= math.exp(u) * A + 1e-5 * (1 + abs(math.exp(u) * A))


def _surrogate_reference(u, A, eps_low, eps_high, dual_clip):
    """The textbook formula, e^u uncapped (float64 here, so nothing overflows below u ≈ 709)."""
    r = torch.exp(u)
    unclipped, clipped = -A * r, -A * r.clamp(1 - eps_low, 1 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    flags = clipped > unclipped
    if dual_clip is not None:
        dual = (A < 0) & (-A * dual_clip < loss)
        loss, flags = torch.where(dual, -A * dual_clip, loss), flags | dual
    return loss, flags


@settings(max_examples=200, deadline=None)
@given(
    st.floats(-30, MAX_LOG_RATIO - 0.01),
    # no subnormal A: r·A and clip(r)·A round to the same few bits there (5e-324 at r = 1.65,
    # ε 0.5), so the reference's flag (clipped > unclipped) misses a clip the log-space flag sees
    st.floats(-10, 10, allow_subnormal=False),
    st.floats(0.01, 0.9),
    st.floats(0.01, 0.9),
    st.none() | st.floats(1.5, 20),
)
def test_capped_ratio_changes_no_value_flag_or_gradient(u, A, eps_low, eps_high, dual_clip):
    # below MAX_LOG_RATIO the overflow-safe surrogate is the textbook one, gradients included
    u_ours = torch.tensor(u, dtype=torch.float64, requires_grad=True)
    u_ref = torch.tensor(u, dtype=torch.float64, requires_grad=True)
    A_t = torch.tensor(A, dtype=torch.float64)
    ours, ours_flags = clipped_surrogate(u_ours, A_t, eps_low, eps_high, dual_clip)
    ref, ref_flags = _surrogate_reference(u_ref, A_t, eps_low, eps_high, dual_clip)
    ours.backward()
    ref.backward()
    assert ours.item() == pytest.approx(ref.item(), rel=1e-12, abs=1e-12)
    assert bool(ours_flags) == bool(ref_flags)
    assert u_ours.grad.item() == pytest.approx(u_ref.grad.item(), rel=1e-9, abs=1e-12)


def test_long_sequence_ratio_stays_finite():
    # 1,536 tokens each 0.1 nats more likely: u = 153.6, e^u overflows float32 (it made NaN
    # gradients, NaN weights and a rejected update on an H100 before the cap)
    T = 1536
    logp_cur = torch.full((3, T), -2.0)
    logp_theta = (logp_cur + 0.1).requires_grad_()
    mask = torch.ones(3, T)
    A = torch.tensor([1.0, -1.0, -2.0])
    for dual_clip, negative in ((None, math.exp(MAX_LOG_RATIO)), (10.0, 10.0)):
        logp_theta.grad = None
        out = policy_loss(logp_theta, logp_cur, A, mask, ratio="seq", dual_clip=dual_clip)
        out.loss.backward()
        # rows: −1.2·1 (clipped), then 1·cap and 2·cap (A < 0: the unclipped or dual branch)
        expected = (-1.2 + negative + 2 * negative) / 3
        assert out.loss.item() == pytest.approx(expected, rel=1e-5)
        assert torch.isfinite(logp_theta.grad).all()
        assert (logp_theta.grad == 0).all()  # every term is past its clip or its cap
        assert float(out.clip_fraction) == pytest.approx(1 / 3 if dual_clip is None else 1.0)


def test_dual_clip_caps_negative_advantage_loss():
    # A = −1, r = e^3 ≈ 20: standard PPO loss 20.09, dual-clip caps it at C·|A| = 10
    loss, clipped = clipped_surrogate(
        torch.tensor(3.0), torch.tensor(-1.0), 0.2, 0.28, dual_clip=10.0
    )
    assert loss.item() == pytest.approx(10.0)
    assert bool(clipped)


def test_clipped_branch_has_no_gradient():
    u = torch.tensor([math.log(1.5)], requires_grad=True)
    loss, _ = clipped_surrogate(u, torch.tensor([1.0]), 0.2, 0.2)
    loss.sum().backward()
    assert u.grad.item() == 0.0


def test_aggregations_by_hand():
    per_token = torch.tensor([[1.0, 3.0, 100.0], [5.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, "token_mean").item() == pytest.approx(3.0)  # (1 + 3 + 5) / 3
    assert aggregate(per_token, mask, "seq_mean").item() == pytest.approx(3.5)  # (2 + 5) / 2
    per_sequence = torch.tensor([2.0, 5.0])
    assert aggregate(per_sequence, mask, "token_mean").item() == pytest.approx(
        3.0
    )  # (2 + 2 + 5) / 3
    # a sequence that owns no tokens does not count in seq_mean
    assert (
        aggregate(per_sequence, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), "seq_mean").item()
        == 2.0
    )


def test_kl_penalty_is_aggregated_as_the_policy_loss():
    """β · KL with the policy term's weights: a sequence of 10 tokens at KL 1 and one of 100 at
    KL 0 give β·10/110 token-mean and β·(1 + 0)/2 seq-mean, however the rows are cut into
    micro-batches (each weighted by its share of the normaliser, as the learner does)."""
    kl = torch.zeros(2, 100)
    kl[0, :10] = 1.0
    mask = torch.zeros(2, 100)
    mask[0, :10], mask[1, :] = 1.0, 1.0
    beta = 0.5
    assert kl_penalty(kl, mask, beta, "token_mean").item() == pytest.approx(beta * 10 / 110)
    assert kl_penalty(kl, mask, beta, "seq_mean").item() == pytest.approx(beta * 0.5)
    for how, share in (("token_mean", mask.sum(-1) / mask.sum()), ("seq_mean", [0.5, 0.5])):
        split = sum(
            kl_penalty(kl[r : r + 1], mask[r : r + 1], beta, how) * share[r] for r in range(2)
        )
        assert split.item() == pytest.approx(kl_penalty(kl, mask, beta, how).item())
