"""Rollout correction (design §12): w = π_prox/π_behaviour per token or per sequence, truncated
at C or masked beyond it, with the mismatch it measures."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satseq.algo.rollout_correction import rollout_correction

# two rows: row 0's tokens are both the model's; row 1's second token is tool output (mask 0)
LOGP_PROX = torch.tensor([[-1.5, -1.0], [-0.2, -3.0]])
LOGP_BEHAVIOUR = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def test_token_weights_by_hand():
    c = rollout_correction(LOGP_PROX, LOGP_BEHAVIOUR, MASK, "token", "truncate", cap=2.0)
    # log w = (−0.5, 1.0 | 0.3, masked): w = (e^−0.5, min(e, 2) | e^0.3, 1)
    expected = [math.exp(-0.5), 2.0, math.exp(0.3), 1.0]
    assert c.weights.flatten().tolist() == pytest.approx(expected, rel=1e-6)
    assert c.capped_fraction == pytest.approx(1 / 3)  # e > 2 on one of three tokens
    assert c.mismatch == pytest.approx((0.5 + 1.0 + 0.3) / 3)
    assert c.weight_min == pytest.approx(math.exp(-0.5), rel=1e-6)
    assert c.weight_max == pytest.approx(2.0)
    assert c.weight_mean == pytest.approx((math.exp(-0.5) + 2.0 + math.exp(0.3)) / 3, rel=1e-6)
    masked = rollout_correction(LOGP_PROX, LOGP_BEHAVIOUR, MASK, "token", "mask", cap=2.0)
    assert masked.weights.flatten().tolist() == pytest.approx(
        [math.exp(-0.5), 0.0, math.exp(0.3), 1.0], rel=1e-6
    )


def test_sequence_weights_by_hand():
    # row 0: −0.5 + 1.0 = 0.5 → e^0.5 = 1.6487 (under C = 2: not capped, and not cut to 1 as
    # min(1, ·) did); row 1: 0.3 → e^0.3
    c = rollout_correction(LOGP_PROX, LOGP_BEHAVIOUR, MASK, "sequence", "truncate", cap=2.0)
    assert c.weights.tolist() == pytest.approx([math.exp(0.5), math.exp(0.3)], rel=1e-6)
    assert c.capped_fraction == 0.0
    c = rollout_correction(LOGP_PROX, LOGP_BEHAVIOUR, MASK, "sequence", "truncate", cap=1.5)
    assert c.weights.tolist() == pytest.approx([1.5, math.exp(0.3)], rel=1e-6)
    assert c.capped_fraction == 0.5
    c = rollout_correction(LOGP_PROX, LOGP_BEHAVIOUR, MASK, "sequence", "mask", cap=1.5)
    assert c.weights.tolist() == pytest.approx([0.0, math.exp(0.3)], rel=1e-6)
    # a row with no model token weighs 1
    empty = rollout_correction(LOGP_PROX, LOGP_BEHAVIOUR, MASK * 0, "sequence", "mask", 2.0)
    assert empty.weights.tolist() == [1.0, 1.0] and empty.mismatch == 0.0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="cap"):
        rollout_correction(LOGP_PROX, LOGP_BEHAVIOUR, MASK, "token", "truncate", cap=1.0)
    with pytest.raises(ValueError, match="level"):
        rollout_correction(LOGP_PROX, LOGP_BEHAVIOUR, MASK, "row", "truncate", cap=2.0)
    with pytest.raises(ValueError, match="mode"):
        rollout_correction(LOGP_PROX, LOGP_BEHAVIOUR, MASK, "token", "clip", cap=2.0)


def test_rounding_alone_no_longer_shrinks_the_mean_weight():
    """Per-token mismatch σ 0.01 over 1,000 tokens and no policy change (design §12): the
    sequence weight min(1, w) has mean ≈ 0.90 (E min(1, e^X), X ~ N(0, 0.1)); the truncated
    weight's mean stays at E e^X = e^0.05 ≈ 1.05 (less what the cap C = 2 cuts), not below 1."""
    generator = torch.Generator().manual_seed(0)
    logp_behaviour = -torch.rand(512, 1000, generator=generator)
    logp_prox = logp_behaviour + 0.01 * torch.randn(512, 1000, generator=generator)
    mask = torch.ones(512, 1000)
    c = rollout_correction(logp_prox, logp_behaviour, mask, "sequence", "truncate", cap=2.0)
    old = torch.exp((logp_prox - logp_behaviour).sum(-1)).clamp(max=1.0)
    assert float(old.mean()) == pytest.approx(0.895, abs=0.02)
    assert c.weight_mean == pytest.approx(1.04, abs=0.03)
    assert c.mismatch == pytest.approx(0.01 * math.sqrt(2 / math.pi), rel=0.05)  # E|N(0, σ²)|


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 8),
    st.sampled_from(["token", "sequence"]),
    st.sampled_from(["truncate", "mask"]),
    st.floats(1.01, 10.0),
    st.integers(0, 2**31 - 1),
)
def test_weights_are_the_ratio_within_the_cap(B, T, level, mode, cap, seed):
    generator = torch.Generator().manual_seed(seed)
    logp_prox = -3 * torch.rand(B, T, generator=generator)
    logp_behaviour = -3 * torch.rand(B, T, generator=generator)
    mask = (torch.rand(B, T, generator=generator) < 0.7).float()
    c = rollout_correction(logp_prox, logp_behaviour, mask, level, mode, cap)
    delta = ((logp_prox - logp_behaviour) * mask).double()
    ratio = delta.exp() if level == "token" else delta.sum(-1).exp()
    terms = mask > 0 if level == "token" else mask.sum(-1) > 0
    w = c.weights.double()
    assert torch.all(w[~terms] == 1.0)
    assert torch.all((w >= 0) & (w <= cap * (1 + 1e-6)))
    within = terms & (ratio <= cap)
    assert torch.allclose(w[within], ratio[within], rtol=1e-5)
    beyond = terms & (ratio > cap)
    expected_beyond = cap if mode == "truncate" else 0.0
    assert torch.allclose(w[beyond], torch.full_like(w[beyond], expected_beyond), rtol=1e-5)
    assert c.capped_fraction == pytest.approx(float(beyond.sum()) / max(int(terms.sum()), 1))
