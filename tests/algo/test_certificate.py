"""Certificates: the theorem terms by hand, the bandit identity, and PAC coverage on a toy
policy whose J is computed exactly by enumerating every sequence."""

import copy
import math

import pytest
import torch

from satseq.algo.advantages import group_advantages
from satseq.algo.certificate import (
    bandit_lower_bound,
    mean_lower_confidence,
    surrogate_gain,
    theorem_terms,
    truncation_bias,
)
from satseq.algo.kl import kl_exact, kl_quantile, sequence_kl
from satseq.algo.logprobs import token_logprobs
from satseq.algo.losses import kl_penalty, policy_loss
from satseq.algo.trust_region import TrustRegion


def test_theorem_terms_by_hand():
    terms = theorem_terms(
        surrogate=0.02,
        delta_i=0.08,
        A_max=2.0,
        gamma=0.5,
        zeta_i=0.01,
        N_i=50,
        n_agents=2,
        delta_conf=0.1,
        w_max=1.5,
    )
    assert terms.information_gain == pytest.approx(0.04)  # 0.02 / (1 − 0.5)
    assert terms.occupancy_shift == pytest.approx(
        2 * 0.5 / 0.25 * 2.0 * 0.2
    )  # sqrt(0.04) = 0.2 → 1.6
    assert terms.estimator_bias == pytest.approx(0.02)
    # the range of c·(r − 1)·A is 2·w_max·A_max = 6, over 1 − γ = 0.5: 12·sqrt(ln 40 / 100)
    assert terms.finite_sample == pytest.approx(12.0 * math.sqrt(math.log(40) / 100))


def test_theorem_terms_are_vacuous_at_gamma_099():
    terms = theorem_terms(0.05, 0.01, 1.0, 0.99, 0.0, 10_000, 3, 0.05, w_max=2.0)
    penalties = terms.occupancy_shift + terms.estimator_bias + terms.finite_sample
    assert terms.information_gain - penalties < -100


def test_surrogate_gain_and_truncation_bias_by_hand():
    u = torch.tensor([math.log(1.5), math.log(0.5)])
    A = torch.tensor([1.0, -1.0])
    c = torch.tensor([1.0, 0.5])
    assert surrogate_gain(u, A, c) == pytest.approx((1 * 0.5 * 1 + 0.5 * -0.5 * -1) / 2)  # 0.375
    # u = 100 overflows e^u in float32; an A = 0 row then made the mean NaN
    long = torch.tensor([100.0, math.log(1.5)])
    expected = (math.expm1(100.0) * 0.0 + 0.5 * 1.0) / 2
    assert surrogate_gain(long, torch.tensor([0.0, 1.0]), torch.ones(2)) == pytest.approx(expected)
    # earlier agents' ratios ρ = (2, 0.5) truncated to c = (1, 0.5): ζ = A_max · mean(1, 0) = 1.5
    assert truncation_bias(
        torch.log(torch.tensor([2.0, 0.5])), torch.tensor([1.0, 0.5]), 3.0
    ) == pytest.approx(1.5)


def test_bernstein_and_hoeffding_radii_by_hand():
    x = torch.tensor([0.0, 1.0, 0.0, 1.0])  # sample variance 1/3
    log_term = math.log(2 / 0.1)
    expected = math.sqrt(2 * (1 / 3) * log_term / 4) + 7 * log_term / (3 * 3)
    assert mean_lower_confidence(x, 1.0, 0.1, "bernstein") == pytest.approx(expected)
    assert mean_lower_confidence(x, 1.0, 0.1, "hoeffding") == pytest.approx(
        math.sqrt(math.log(10) / 8)
    )
    assert mean_lower_confidence(x[:1], 1.0, 0.1, "bernstein") == math.inf


def test_bandit_bound_pieces_by_hand():
    # w = (2, 0.5, 1, 1) with w_max = 1.5 → w̄ = (1.5, 0.5, 1, 1); R = (1, 0, 1, 0), b = 0.5
    log_w = torch.log(torch.tensor([2.0, 0.5, 1.0, 1.0]))
    R = torch.tensor([1.0, 0.0, 1.0, 0.0])
    cert = bandit_lower_bound(log_w, R, b=0.5, R_min=0.0, R_max=1.0, w_max=1.5, delta_conf=0.2)
    # X = (0.5·0.5, −0.5·−0.5, 0, 0) → mean 0.125
    assert cert.estimate == pytest.approx(0.125)
    X = torch.tensor([0.25, 0.25, 0.0, 0.0])
    X_range = 1.0  # corners (w̄ − 1)(R − b) for w̄ ∈ {0, 1.5}, R − b ∈ {±0.5}: from −0.5 to 0.5
    assert cert.deviation == pytest.approx(mean_lower_confidence(X, X_range, 0.1, "bernstein"))
    w_dev = mean_lower_confidence(torch.tensor([1.5, 0.5, 1.0, 1.0]), 1.5, 0.1, "bernstein")
    assert cert.truncation_bias == pytest.approx(0.5 * min(1.0 - 1.0 + w_dev, 1.0))
    assert cert.lower_bound == pytest.approx(cert.estimate - cert.deviation - cert.truncation_bias)


def test_the_bound_averages_each_prompts_samples_first():
    # two prompts of two samples: w = (2, 0.5 | 1, 1), R = (1, 0 | 1, 0), b = 0.5, w_max = 1.5
    log_w = torch.log(torch.tensor([2.0, 0.5, 1.0, 1.0]))
    R = torch.tensor([1.0, 0.0, 1.0, 0.0])
    prompts = torch.tensor([7, 7, 3, 3])
    cert = bandit_lower_bound(
        log_w, R, b=0.5, R_min=0.0, R_max=1.0, w_max=1.5, delta_conf=0.2, prompts=prompts
    )
    assert cert.n == 2  # the prompts are the independent units
    # per prompt X̄ = (0.25, 0) [prompt 3 first: sorted ids], w̄ = (1, 1)
    assert cert.estimate == pytest.approx(0.125)
    X = torch.tensor([0.0, 0.25])
    assert cert.deviation == pytest.approx(mean_lower_confidence(X, 1.0, 0.1, "bernstein"))
    w_dev = mean_lower_confidence(torch.tensor([1.0, 1.0]), 1.5, 0.1, "bernstein")
    assert cert.truncation_bias == pytest.approx(0.5 * min(w_dev, 1.0))


def test_the_bound_covers_the_truth_with_correlated_groups():
    """G = 32 samples a prompt share its move (design §4): by prompt the bound holds in ≥ 95 %
    of stages; taking the n·G samples as independent it does not (the old estimator)."""
    from bench.certificate_coverage import coverage

    alike = {"rates": (0.7, 0.7), "shift": 0.25}  # every prompt at 0.7, moved ±0.25
    assert coverage(G=32, n=128, stages=400, **alike).coverage >= 0.95
    assert coverage(G=32, n=128, stages=400, by_prompt=False, **alike).coverage < 0.9


def test_the_bound_covers_heterogeneous_prompts_past_w_max_and_its_slack_is_needed():
    """Rates spread over (0.02, 0.98) and moved ±0.2, so w passes w_max on a share of the
    samples, most of them wrong answers weighed against b = 0.8 (truncation hides negative
    mass: the estimate alone is biased high). The bound covers in ≥ 95 % of the stages; with
    its slack (deviation and truncation terms) cut to 0.1× it does not: the check has power."""
    from bench.certificate_coverage import coverage

    full = coverage(G=8, n=1024, stages=300, baseline=0.8)
    assert full.beyond_w_max > 0.01 and full.coverage >= 0.95
    assert coverage(G=8, n=1024, stages=300, baseline=0.8, slack_scale=0.1).coverage < 0.8
    assert coverage(G=16, n=512, shift=0.1, drift=0.1, stages=50).positive > 0


# --- the toy problem: vocabulary 3, length 3, an autoregressive softmax table -------------------

V, L = 3, 3
BOS = V
SEQUENCES = torch.cartesian_prod(*[torch.arange(V)] * L)  # [27, 3]: every possible response
FULL_MASK = torch.ones(len(SEQUENCES), L)


def _logits(theta, sequences):
    """theta [L, V + 1, V] holds the logits of position t given the previous token → [N, L, V]."""
    previous = torch.cat([torch.full((len(sequences), 1), BOS), sequences[:, :-1]], dim=1)
    return theta[torch.arange(L), previous]


def _sequence_logprob(theta, sequences):
    return token_logprobs(_logits(theta, sequences), sequences).sum(-1)


def _J(theta, reward_table):
    """Exact J(π) = Σ_y π(y) R(y) over all 27 sequences."""
    return float((_sequence_logprob(theta, SEQUENCES).exp() * reward_table).sum())


def test_bandit_identity_holds_exactly_under_enumeration():
    g = torch.Generator().manual_seed(1)
    theta, theta_new = torch.randn(L, V + 1, V, generator=g), torch.randn(L, V + 1, V, generator=g)
    R = torch.randint(0, 2, (len(SEQUENCES),), generator=g).float()
    p = _sequence_logprob(theta, SEQUENCES).exp()
    w = (_sequence_logprob(theta_new, SEQUENCES) - _sequence_logprob(theta, SEQUENCES)).exp()
    for b in (0.0, 0.3, 1.0):  # any constant baseline gives the same expectation
        assert float((p * (w - 1) * (R - b)).sum()) == pytest.approx(
            _J(theta_new, R) - _J(theta, R), abs=1e-5
        )


def _trust_region_update(theta, sequences, rewards, region, steps, lr):
    """One SAT-Seq-style update of the toy policy on a training batch, through the algo API."""
    logits_cur = _logits(theta, sequences).detach()
    logp_cur = token_logprobs(logits_cur, sequences)
    mask = torch.ones_like(logp_cur)
    A = group_advantages(rewards.unsqueeze(0)).advantages.squeeze(0)
    theta = theta.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([theta], lr=lr)

    def take_step(beta, step_scale):
        for group in optimizer.param_groups:
            group["lr"] = lr * step_scale
        optimizer.zero_grad()
        logits = _logits(theta, sequences)
        loss = policy_loss(
            token_logprobs(logits, sequences), logp_cur, A, mask, ratio="seq", eps_low=0.2
        ).loss
        (loss + kl_penalty(kl_exact(logits, logits_cur), mask, beta, "seq_mean")).backward()
        optimizer.step()
        with torch.no_grad():
            return kl_quantile(
                sequence_kl(kl_exact(_logits(theta, sequences), logits_cur), mask), region.alpha
            )

    def save():
        return theta.detach().clone(), copy.deepcopy(optimizer.state_dict())

    def restore(snapshot):
        weights, opt_state = snapshot
        with torch.no_grad():
            theta.copy_(weights)
        optimizer.load_state_dict(opt_state)

    for _ in range(steps):
        for beta, step_scale in region.attempts(save, restore):
            region.judge(take_step(beta, step_scale))
    return theta.detach()


@pytest.mark.parametrize("staleness", [0, 1])
def test_bandit_certificate_coverage_on_enumerable_toy(staleness):
    """≥ 300 stages: the bound must hold in ≥ 1 − δ_conf of them and be positive in some.

    staleness 1 (overlapped stages, design §12): every stage's samples come from the policy one
    stage older, π_b, and the bound is the pair's it can certify, J(π_new) − J(π_b), with
    w = π_new/π_b on the held-out samples of π_b."""
    delta_conf, n_train, n_cert = 0.1, 64, 2048
    runs, stages_per_run = 30, 10
    holds, positive, total = 0, 0, 0
    gen = torch.Generator().manual_seed(2026 + staleness)
    for _ in range(runs):
        theta = 0.5 * torch.randn(L, V + 1, V, generator=gen)
        behaviour = theta
        reward_table = torch.randint(0, 2, (len(SEQUENCES),), generator=gen).float()
        region = TrustRegion(target_kl=0.05, alpha=0.1, max_backtracks=3, beta=0.05)  # β persists
        for _ in range(stages_per_run):
            probs = _sequence_logprob(behaviour, SEQUENCES).exp()
            train_idx = torch.multinomial(probs, n_train, replacement=True, generator=gen)
            train_rewards = reward_table[train_idx]
            new_theta = _trust_region_update(
                theta, SEQUENCES[train_idx], train_rewards, region, steps=3, lr=0.3
            )
            # Certificate samples: drawn from π_b independently of the update (a held-out batch).
            cert_idx = torch.multinomial(probs, n_cert, replacement=True, generator=gen)
            log_w = (
                _sequence_logprob(new_theta, SEQUENCES) - _sequence_logprob(behaviour, SEQUENCES)
            )[cert_idx]
            cert = bandit_lower_bound(
                log_w,
                reward_table[cert_idx],
                b=float(train_rewards.mean()),
                R_min=0.0,
                R_max=1.0,
                w_max=2.0,
                delta_conf=delta_conf,
            )
            true_gain = _J(new_theta, reward_table) - _J(behaviour, reward_table)
            holds += cert.lower_bound <= true_gain
            positive += cert.lower_bound > 0
            total += 1
            behaviour = theta if staleness else new_theta  # what samples the next stage
            theta = new_theta
    coverage, positive_fraction = holds / total, positive / total
    print(
        f"\ncertificate coverage {coverage:.3f} over {total} stages;"
        f" positive in {positive_fraction:.3f}"
    )
    assert total >= 300
    assert coverage >= 1 - delta_conf
    assert positive_fraction > 0
