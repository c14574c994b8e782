"""SAT-Seq's per-stage certificate (DESIGN §4): the Theorem 4.4/4.7 terms of each agent's update
and the bandit-form lower bound on the held-out trajectories, as named steps of the recipe."""

from __future__ import annotations

from typing import Any

import torch

from satseq.algo import (
    bandit_lower_bound,
    masked_sum,
    surrogate_gain,
    theorem_terms,
    truncation_bias,
)
from satseq.cluster.stage_batch import StageBatch
from satseq.config.schema import RunConfig

R_MIN, R_MAX = 0.0, 1.0  # verifiable rewards are 0 or 1
CERT_PREFIX = "cert/"


def agent_certificate(
    config: RunConfig,
    u: torch.Tensor,
    A: torch.Tensor,
    c: torch.Tensor,
    log_ratio_prev: torch.Tensor,
    kl_quantile: float,
    n_agents: int,
) -> dict[str, float]:
    """The theorem's terms for one agent's update on its N_i rows, as `cert/<term>` metrics.

    u, A, c, log_ratio_prev [N_i]: the agent's sequence log-ratio after its update, advantages,
    IS weights, and the log-ratio of the agents updated before it.
    """
    s = config.sat_seq
    N_i = len(u)
    terms = theorem_terms(
        surrogate=surrogate_gain(u, A, c) if N_i else 0.0,
        delta_i=kl_quantile,
        A_max=s.A_clip,
        gamma=config.algorithm.gamma,
        zeta_i=truncation_bias(log_ratio_prev, c, s.A_clip) if N_i else 0.0,
        N_i=N_i,
        n_agents=n_agents,
        delta_conf=config.algorithm.certificate.delta_conf,
    )
    return {
        f"{CERT_PREFIX}information_gain": terms.information_gain,
        f"{CERT_PREFIX}occupancy_shift": terms.occupancy_shift,
        f"{CERT_PREFIX}estimator_bias": terms.estimator_bias,
        f"{CERT_PREFIX}finite_sample": terms.finite_sample,
        f"{CERT_PREFIX}lower_bound": terms.lower_bound,
    }


def bandit_certificate(
    config: RunConfig,
    batch: StageBatch,
    logp_cur: torch.Tensor,
    logp_new: torch.Tensor,
    baseline_reward: float,
) -> dict[str, float]:
    """J(π_new) − J(π_start) ≥ lower_bound, from the held-out rows (never trained on).

    logp_cur, logp_new [N, T]: every token under the stage-start and the final weights of its
    owner; the whole team's sequence ratio is w = exp(Σ (logp_new − logp_cur)).
    """
    rows = list(range(batch.n_train, len(batch.trajectories)))
    team_tokens = batch.owned_by(list(range(batch.owns.shape[0])))[rows]
    log_w = masked_sum(logp_new[rows] - logp_cur[rows], team_tokens, dim=-1)
    cert = config.algorithm.certificate
    bound = bandit_lower_bound(
        log_w,
        batch.rewards[rows],
        b=baseline_reward,
        R_min=R_MIN,
        R_max=R_MAX,
        w_max=cert.w_max,
        delta_conf=cert.delta_conf,
        inequality=cert.inequality,
    )
    return {
        "estimate": bound.estimate,
        "deviation": bound.deviation,
        "truncation_bias": bound.truncation_bias,
        "lower_bound": bound.lower_bound,
        "n": bound.n,
    }


def certificate_record(
    bandit: dict[str, float] | None, per_agent: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """The stage's line of certificates.jsonl: the bandit bound and each agent's terms."""
    return {
        "bandit": bandit,
        "agents": {
            name: {
                key.removeprefix(CERT_PREFIX): value
                for key, value in values.items()
                if key.startswith(CERT_PREFIX)
            }
            for name, values in per_agent.items()
        },
    }
