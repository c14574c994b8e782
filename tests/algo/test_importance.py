"""Truncated IS weights: hand values and the (0, 1] property."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satseq.algo.importance import truncated_is_weights
from satseq.algo.masks import owner_mask


def test_is_weight_by_hand():
    logp_hat = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
    logp_cur = torch.tensor([[-1.5, -1.0, -0.5], [-1.0, -1.5, -1.0]])
    owner_ids = torch.tensor([[0, 0, 1], [1, 0, 2]])
    response = torch.ones(2, 3)
    updated = owner_mask(owner_ids, [0], response)  # agent 0 was updated before agent 1
    c = truncated_is_weights(logp_hat, logp_cur, updated, max_log_ratio=5.0)
    # row 0: Σ over agent 0's tokens = 0.5 − 1.0 = −0.5 → exp(−0.5); row 1: +0.5 → min(1, e^0.5) = 1
    assert torch.allclose(c, torch.tensor([math.exp(-0.5), 1.0]))


def test_is_weight_clamps_log_ratio():
    c = truncated_is_weights(
        torch.tensor([[-20.0]]), torch.tensor([[0.0]]), torch.ones(1, 1), max_log_ratio=3.0
    )
    assert c.item() == pytest.approx(math.exp(-3.0))


def test_no_updated_tokens_gives_weight_one():
    c = truncated_is_weights(torch.zeros(1, 4), torch.full((1, 4), -3.0), torch.zeros(1, 4), 5.0)
    assert c.item() == 1.0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 8), st.floats(0.1, 50.0), st.integers(0, 10_000))
def test_is_weights_lie_in_zero_one(B, T, max_log_ratio, seed):
    g = torch.Generator().manual_seed(seed)
    logp_hat = -10 * torch.rand(B, T, generator=g)
    logp_cur = -10 * torch.rand(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.5).float()
    c = truncated_is_weights(logp_hat, logp_cur, mask, max_log_ratio)
    assert torch.all(c > 0) and torch.all(c <= 1)


def test_owner_mask_respects_response_mask():
    owner_ids = torch.tensor([[0, 1, 1, -1]])
    response = torch.tensor([[1.0, 1.0, 0.0, 0.0]])  # third token is tool output
    assert owner_mask(owner_ids, [1], response).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert owner_mask(owner_ids, [0, 1], response).tolist() == [[1.0, 1.0, 0.0, 0.0]]
