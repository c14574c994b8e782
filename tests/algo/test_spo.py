"""SPO tracker, prior, forgetting and sampler against hand values and plain-loop references."""

import itertools
import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from satseq.algo.spo import (
    BetaTracker,
    PrioritisedSampler,
    beta_prior,
    binarise_score,
    discounted_beta_update,
    kl_adaptive_rho,
    prior_sample_count,
    sampling_weights,
)


def assert_same_state(a, b):
    """Recursive equality of state dicts holding tensors, arrays and plain values."""
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same_state(a[key], b[key])
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


# ---- prior ---------------------------------------------------------------------------------


def test_prior_hand_values():
    # n0 = 8, s = 3, rho_min = 0.875 -> N0 = 8, alpha0 = 8 * 3.5 / 9, beta0 = 8 * 5.5 / 9
    scores = [1, 0, 1, 0, 0, 1, 0, 0]
    assert prior_sample_count(0.875) == pytest.approx(8.0)
    alpha0, beta0 = beta_prior(scores, rho_min=0.875)
    assert alpha0 == pytest.approx(8 * 3.5 / 9)
    assert beta0 == pytest.approx(8 * 5.5 / 9)


def test_prior_binarises_scores_strictly_above_half():
    assert [binarise_score(s) for s in (0.0, 0.5, 0.51, 1.0)] == [0, 0, 1, 1]
    # graded scores: 0.9 and 0.7 succeed, 0.5 and 0.2 do not -> s = 2 of n0 = 4, N0 = 4
    alpha0, beta0 = beta_prior([0.9, 0.5, 0.7, 0.2], rho_min=0.75)
    assert (alpha0, beta0) == pytest.approx((4 * 2.5 / 5, 4 * 2.5 / 5))


def test_no_offline_scores_gives_half_half():
    assert beta_prior([], rho_min=0.875) == (0.5, 0.5)
    tracker = BetaTracker()
    tracker.add("unseen")
    tracker.add("also unseen", offline_scores=[])
    tracker.add("seen", offline_scores=[1.0, 0.0])
    assert tracker.alpha_beta("unseen") == (0.5, 0.5)
    assert tracker.p_hat("unseen") == 0.5
    assert tracker.n_eff("unseen") == 1.0
    assert not tracker.has_prior("also unseen") and tracker.has_prior("seen")
    assert tracker.n_without_prior == 2


# ---- tracker update --------------------------------------------------------------------------


def test_update_hand_values():
    assert discounted_beta_update(2.0, 3.0, reward=1, rho=0.5) == (2.0, 1.5)
    tracker = BetaTracker(rho_min=0.875)
    key = ("agent_0", "What is 1+1?")
    tracker.add(key, offline_scores=[1, 0, 1, 0, 0, 1, 0, 0])  # alpha0 = 28/9, beta0 = 44/9
    tracker.update(key, reward=1, rho=0.875)
    alpha, beta = tracker.alpha_beta(key)
    assert alpha == pytest.approx(0.875 * 28 / 9 + 1)
    assert beta == pytest.approx(0.875 * 44 / 9)
    assert tracker.p_hat(key) == pytest.approx(alpha / (alpha + beta))
    assert tracker.n_eff(key) == pytest.approx(alpha + beta)
    tracker.update(key, reward=0, rho=0.9)
    assert tracker.alpha_beta(key) == pytest.approx((0.9 * alpha, 0.9 * beta + 1))


def test_update_rejects_unregistered_keys_and_bad_rewards():
    tracker = BetaTracker()
    with pytest.raises(KeyError, match="never registered"):
        tracker.update("nope", reward=1, rho=0.9)
    tracker.add("k")
    with pytest.raises(ValueError, match="already registered"):
        tracker.add("k")
    with pytest.raises(ValueError, match="outside"):
        tracker.update("k", reward=-1.0, rho=0.9)


rewards = st.lists(st.integers(0, 1), max_size=60)
offline = st.lists(st.floats(0.0, 1.0), max_size=16)


@settings(max_examples=60, deadline=None)
@given(offline_scores=offline, stream=rewards, rho=st.floats(0.5, 1.0))
def test_mean_stays_inside_unit_interval(offline_scores, stream, rho):
    tracker = BetaTracker(rho_min=0.875)
    tracker.add("k", offline_scores)
    for r in stream:
        tracker.update("k", reward=r, rho=rho)
        assert 0.0 < tracker.p_hat("k") < 1.0


@settings(max_examples=60, deadline=None)
@given(offline_scores=offline, stream=rewards)
def test_rho_one_is_the_exact_beta_posterior(offline_scores, stream):
    tracker = BetaTracker(rho_min=0.875)
    tracker.add("k", offline_scores)
    alpha0, beta0 = beta_prior(offline_scores, rho_min=0.875)
    for r in stream:
        tracker.update("k", reward=r, rho=1.0)
    successes = sum(stream)
    assert tracker.alpha_beta("k") == pytest.approx(
        (alpha0 + successes, beta0 + len(stream) - successes)
    )


# ---- forgetting -------------------------------------------------------------------------------


def test_kl_adaptive_rho_hand_cases():
    logp_prev = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    # D = 0 -> 2^0 = 1 -> clamped to rho_max
    assert kl_adaptive_rho(logp_prev, logp_prev.clone(), mask) == 0.96
    # D = 0.06 = D_half -> 0.5 -> clamped to rho_min
    assert kl_adaptive_rho(logp_prev, logp_prev + 0.06, mask) == 0.875
    # D = D_half * log2(1 / 0.92) -> rho = 0.92, inside the clamp
    d = 0.06 * math.log2(1 / 0.92)
    assert kl_adaptive_rho(logp_prev, logp_prev - d, mask) == pytest.approx(0.92)


def test_kl_adaptive_rho_is_a_masked_token_mean_of_absolute_differences():
    logp_prev = np.array([-1.0, -1.0, -1.0, -1.0])
    # |diffs| on masked tokens: 0.01, 0.03 -> D = 0.02 (the unmasked 5.0 is ignored)
    logp_now = np.array([-1.01, -0.97, -6.0, -1.0])
    mask = np.array([1, 1, 0, 0])
    expected = 2 ** (-0.02 / 0.1)
    rho = kl_adaptive_rho(logp_prev, logp_now, mask, d_half=0.1, rho_min=0.1, rho_max=1.0)
    assert rho == pytest.approx(expected)


def test_tracker_rho_modes():
    constant = BetaTracker(rho_mode="constant", rho_min=0.8)
    constant.add("k")
    assert constant.rho("k") == 0.8

    tracker = BetaTracker(rho_mode="kl", rho_min=0.5, rho_max=0.96, d_half=0.06)
    tracker.add("k")
    assert tracker.rho("k") == 0.96  # first visit: nothing stored yet
    stored = torch.tensor([-1.0, -2.0, -0.5])
    tracker.update("k", reward=1, rho=0.96, logprobs=stored, token_ids=torch.tensor([5, 6, 7]))
    stored -= 100.0  # the tracker keeps its own copy
    assert torch.equal(tracker.last_response("k")["logprobs"], torch.tensor([-1.0, -2.0, -0.5]))
    assert torch.equal(tracker.last_response("k")["token_ids"], torch.tensor([5, 6, 7]))
    # D = 0.06 -> 2^-1 = 0.5, inside [0.5, 0.96]
    assert tracker.rho("k", torch.tensor([-1.06, -2.06, -0.56])) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="logp_now"):
        tracker.rho("k")


# ---- checkpoint --------------------------------------------------------------------------------


def test_state_dicts_round_trip_and_resume_identically():
    tracker = BetaTracker(rho_mode="kl")
    for i in range(20):
        tracker.add(("agent_0", f"problem {i}"), offline_scores=[i % 2, 1, 0][: i % 4])
    sampler = PrioritisedSampler(candidate_pool_size=8, gamma_s=0.5, seed=3)
    for step in range(3):
        for key in sampler.sample(tracker, batch_size=4):
            tracker.update(
                key,
                reward=step % 2,
                rho=tracker.rho(key, torch.zeros(3)),
                logprobs=torch.full((3,), -0.01 * step),
            )

    tracker_state = pickle.loads(pickle.dumps(tracker.state_dict()))
    sampler_state = pickle.loads(pickle.dumps(sampler.state_dict()))
    resumed_tracker, resumed_sampler = BetaTracker(), PrioritisedSampler(candidate_pool_size=1)
    resumed_tracker.load_state_dict(tracker_state)
    resumed_sampler.load_state_dict(sampler_state)
    assert_same_state(resumed_tracker.state_dict(), tracker.state_dict())
    assert_same_state(resumed_sampler.state_dict(), sampler.state_dict())
    for _ in range(3):
        assert resumed_sampler.sample(resumed_tracker, 4) == sampler.sample(tracker, 4)


# ---- sampler ---------------------------------------------------------------------------------


def test_sampling_weights_hand_values():
    p_hat = np.array([0.5, 0.1, 0.0])
    n_eff = np.array([4.0, 9.0, 1.0])
    np.testing.assert_allclose(sampling_weights(p_hat, n_eff), [0.55, 0.35, 0.05])
    np.testing.assert_allclose(
        sampling_weights(p_hat, n_eff, gamma_s=0.5), [0.5 / 2 + 0.05, 0.3 / 3 + 0.05, 0.05]
    )


def tracker_with_spread_weights():
    """Six keys whose priors span p_hat from near 0 to 1/2 and N_eff from 1 to 8."""
    tracker = BetaTracker(rho_min=0.875)
    for key, scores in [
        ("a", [1, 0, 1, 0]),
        ("b", [1, 0, 0, 0, 0, 0, 0, 0]),
        ("c", [0] * 8),
        ("d", None),
        ("e", [1, 1, 1, 0]),
        ("f", [1]),
    ]:
        tracker.add(key, scores)
    return tracker


def reference_weights(tracker, keys, gamma_s):
    """w = sqrt(p(1 - p)) / N_eff^gamma_s + 0.05 with a plain loop."""
    return {
        key: math.sqrt(tracker.p_hat(key) * (1 - tracker.p_hat(key)))
        / tracker.n_eff(key) ** gamma_s
        + 0.05
        for key in keys
    }


@pytest.mark.parametrize("gamma_s", [0.0, 1.0])
def test_single_draw_frequencies_match_weights(gamma_s):
    tracker = tracker_with_spread_weights()
    keys = tracker.keys()
    sampler = PrioritisedSampler(candidate_pool_size=len(keys), gamma_s=gamma_s, seed=0)
    draws = 6000
    counts = {key: 0 for key in keys}
    for _ in range(draws):
        (key,) = sampler.sample(tracker, batch_size=1)
        counts[key] += 1
    w = reference_weights(tracker, keys, gamma_s)
    total = sum(w.values())
    expected = [draws * w[key] / total for key in keys]
    assert chisquare([counts[key] for key in keys], expected).pvalue > 1e-3
    # the frequencies are not uniform: the weights do matter
    assert chisquare([counts[key] for key in keys]).pvalue < 1e-6


def test_ordered_pairs_follow_sequential_draws_without_replacement():
    tracker = tracker_with_spread_weights()
    keys = ["a", "b", "c", "d"]
    sampler = PrioritisedSampler(candidate_pool_size=4, seed=1)
    draws = 6000
    counts = dict.fromkeys(itertools.permutations(keys, 2), 0)
    for _ in range(draws):
        batch = sampler.sample(tracker, batch_size=2, keys=keys)
        counts[tuple(batch)] += 1
    # P(i then j) = w_i / W * w_j / (W - w_i)
    w = reference_weights(tracker, keys, gamma_s=0.0)
    total = sum(w.values())
    expected = [draws * w[i] / total * w[j] / (total - w[i]) for i, j in counts]
    assert chisquare(list(counts.values()), expected).pvalue > 1e-3


def test_batches_have_no_duplicates_and_come_from_a_uniform_pool():
    tracker = BetaTracker()
    for i in range(10):
        # key 0: p_hat = 50.5 / 51, w ~ 0.15; the rest p_hat = 1/2, w = 0.55
        tracker.add(i, offline_scores=[1] * 50 if i == 0 else [1, 0])
    sampler = PrioritisedSampler(candidate_pool_size=3, seed=2)
    draws = 3000
    counts = dict.fromkeys(range(10), 0)
    for _ in range(draws):
        batch = sampler.sample(tracker, batch_size=3)
        assert len(set(batch)) == 3
        for key in batch:
            counts[key] += 1
    # batch = pool, and the pool is uniform: key 0's low weight cannot lower its frequency
    assert chisquare(list(counts.values()), [draws * 3 / 10] * 10).pvalue > 1e-3
    with pytest.raises(ValueError, match="candidate pool of 3"):
        sampler.sample(tracker, batch_size=4)


def test_exclude_without_prior():
    tracker = tracker_with_spread_weights()
    assert tracker.n_without_prior == 1
    sampler = PrioritisedSampler(candidate_pool_size=100, exclude_without_prior=True, seed=0)
    assert "d" not in sampler.eligible_keys(tracker)
    for _ in range(50):
        assert "d" not in sampler.sample(tracker, batch_size=5)
    with pytest.raises(ValueError, match="5 eligible keys"):
        sampler.sample(tracker, batch_size=6)
