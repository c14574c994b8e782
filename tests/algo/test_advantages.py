"""Advantages against hand-computed numbers and a plain-loop reference."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satseq.algo.advantages import (
    clip_advantages,
    gae,
    gae_group_advantages,
    group_advantages,
    spo_advantages,
    terminal_rewards,
)


def test_grpo_group_advantage_by_hand():
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5 → A = ±1
    out = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert torch.allclose(out.advantages, torch.tensor([[1.0, -1.0, -1.0, 1.0]]), atol=1e-6)
    assert out.degenerate_groups == 0


def test_grpo_uses_population_std_and_clips():
    # rewards 1, 0, 0, 0: mean 0.25, population std sqrt(3)/4 → A(1) = 0.75 / 0.4330 = sqrt(3)
    out = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert out.advantages[0, 0].item() == pytest.approx(math.sqrt(3), rel=1e-5)
    assert out.advantages[0, 1].item() == pytest.approx(-1 / math.sqrt(3), rel=1e-5)
    clipped = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), A_clip=1.5)
    assert clipped.advantages[0, 0].item() == pytest.approx(1.5)


def test_grpo_baseline_uses_verls_unbiased_std():
    # rewards 1, 0, 0, 0: mean 0.25, Σ (R − b)² = 0.75, unbiased std sqrt(0.75 / 3) = 0.5
    # → A(1) = 0.75 / (0.5 + 1e-6), A(0) = −0.25 / 0.5000010
    out = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), eps=1e-6, unbiased_std=True)
    assert out.advantages[0, 0].item() == pytest.approx(0.75 / 0.500001, rel=1e-6)
    assert out.advantages[0, 1].item() == pytest.approx(-0.25 / 0.500001, rel=1e-6)
    expected = torch.tensor([1.0, 0.0, 0.0, 0.0])
    reference = (expected - expected.mean()) / (expected.std(unbiased=True) + 1e-6)
    torch.testing.assert_close(out.advantages[0], reference)


def test_degenerate_groups_get_zero_and_are_counted():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    out = group_advantages(rewards)
    assert out.degenerate_groups == 2
    assert torch.all(out.advantages[:2] == 0)
    assert torch.all(out.advantages[2] != 0)


def test_dr_grpo_skips_std_division():
    out = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), normalize_std=False)
    assert torch.allclose(out.advantages, torch.tensor([[0.75, -0.25, -0.25, -0.25]]))


def test_is_weights_weight_the_baseline():
    # c = (1, 1, 0.5, 0.5), R = (1, 0, 1, 0): b = (1 + 0.5) / 3 = 0.5 → A_raw = ±0.5
    # weighted population std = sqrt(Σ c (R−b)² / Σ c) = 0.5 → A = ±1
    out = group_advantages(
        torch.tensor([[1.0, 0.0, 1.0, 0.0]]), weights=torch.tensor([[1.0, 1.0, 0.5, 0.5]])
    )
    assert torch.allclose(out.advantages, torch.tensor([[1.0, -1.0, 1.0, -1.0]]), atol=1e-6)
    # and a case where the weights move the baseline: c = (1, 0.25), R = (1, 0) → b = 0.8
    dr = group_advantages(
        torch.tensor([[1.0, 0.0]]), weights=torch.tensor([[1.0, 0.25]]), normalize_std=False
    )
    assert torch.allclose(dr.advantages, torch.tensor([[0.2, -0.8]]), atol=1e-6)


def _gae_reference(rewards, values, mask, gamma, lam):
    """Plain loops: collect the masked steps of each row, run textbook GAE over them."""
    B, T = len(rewards), len(rewards[0])
    out = [[0.0] * T for _ in range(B)]
    for b in range(B):
        steps = [t for t in range(T) if mask[b][t]]
        advantage = 0.0
        for k in reversed(range(len(steps))):
            t = steps[k]
            next_value = values[b][steps[k + 1]] if k + 1 < len(steps) else 0.0
            delta = rewards[b][t] + gamma * next_value - values[b][t]
            advantage = delta + gamma * lam * advantage
            out[b][t] = advantage
    return out


def test_gae_by_hand_two_steps():
    # two tokens, reward 1 at the end, V = (0.5, 0.5), γ = 0.9, λ = 0.8
    # δ_1 = 1 − 0.5 = 0.5; δ_0 = 0 + 0.9·0.5 − 0.5 = −0.05; A_0 = −0.05 + 0.72·0.5 = 0.31
    A, returns = gae(
        torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.5]]), torch.ones(1, 2), 0.9, 0.8
    )
    assert torch.allclose(A, torch.tensor([[0.31, 0.5]]), atol=1e-6)
    assert torch.allclose(returns, torch.tensor([[0.81, 1.0]]), atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 7),
    st.floats(0.5, 1.0),
    st.floats(0.0, 1.0),
    st.integers(0, 10_000),
)
def test_gae_matches_loop_reference_with_skipped_tokens(B, T, gamma, lam, seed):
    g = torch.Generator().manual_seed(seed)
    rewards, values = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.4).float()
    A, _ = gae(rewards, values, mask, gamma, lam)
    expected = _gae_reference(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    assert torch.allclose(A, torch.tensor(expected), atol=1e-5)


def test_gae_group_advantages_token_mean_then_group_norm():
    token_A = torch.tensor([[1.0, 3.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # per-trajectory means: 2 and 0 → group of 2: ±1
    out = gae_group_advantages(token_A, mask, group_size=2)
    assert torch.allclose(out.advantages, torch.tensor([[1.0, -1.0]]), atol=1e-6)


def test_gae_group_advantages_leave_zero_weight_trajectories_out_of_the_baseline():
    token_A = torch.tensor([[1.0, 3.0], [0.0, 0.0], [4.0, 0.0], [9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    # means 2, 0, 4, 9; the last has weight 0 (another agent's): baseline 2, population std 1.633
    out = gae_group_advantages(token_A, mask, group_size=4, weights=torch.tensor([1.0, 1, 1, 0]))
    sigma = (8 / 3) ** 0.5
    expected = torch.tensor([[0.0, -2.0 / sigma, 2.0 / sigma, 7.0 / sigma]])
    assert torch.allclose(out.advantages, expected, atol=1e-5)


def test_terminal_rewards_sit_on_each_rows_last_own_token():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    rewards = terminal_rewards(torch.tensor([1.0, 0.5, 1.0]), mask)
    assert rewards.tolist() == [[0, 1, 0, 0], [0, 0, 0.5, 0], [0, 0, 0, 0]]


def test_clip_advantages():
    assert clip_advantages(torch.tensor([-5.0, 0.3, 5.0]), 2.0).tolist() == [
        -2.0,
        0.30000001192092896,
        2.0,
    ]


def test_spo_advantage_by_hand():
    # r − p̂ = (0.5, −0.5, 0.5, −0.5) → mean 0, population std 0.5 → ±1
    A = spo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0.5, 0.5, 0.5, 0.5]))
    assert torch.allclose(A, torch.tensor([1.0, -1.0, 1.0, -1.0]), atol=1e-6)
    # different baselines: r − p̂ = (0.2, −0.7) → normalised to (1, −1)
    A = spo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.8, 0.7]))
    assert torch.allclose(A, torch.tensor([1.0, -1.0]), atol=1e-5)
