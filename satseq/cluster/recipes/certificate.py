"""SAT-Seq's per-stage certificate (design §4), as named steps of the recipe, all on the stage's
held-out prompts (never the rows the updates were fitted to):

- the bandit-form lower bound on J(π_new) − J(π_start) for the whole team, the prompt the unit
  of independence;
- each agent's held-out gain estimate (the same estimator over its own tokens), which orders
  the next stage's `greedy_gain` scheduler;
- each agent's Theorem 4.4/4.7 terms, logged as terms (`cert/terms/...`), never as a bound.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from satseq.algo import (
    bandit_lower_bound,
    group_advantages,
    kl_k3,
    masked_sum,
    sequence_kl,
    surrogate_gain,
    theorem_terms,
    truncated_is_weights,
    truncation_bias,
    units_to_certify,
)
from satseq.algo.binomial import clopper_pearson_upper
from satseq.cluster.stage_batch import StageBatch
from satseq.config.schema import RunConfig

R_MIN, R_MAX = 0.0, 1.0  # verifiable rewards are 0 or 1


def holdout_size(config: RunConfig, n_prompts: int) -> int:
    """How many of a stage's `n_prompts` prompts (the last ones) certify it, never training."""
    return math.floor(config.algorithm.certificate.holdout_fraction * n_prompts)


def checked_prompts(config: RunConfig, batch_size: int) -> int:
    """The prompts of a stage of `batch_size` whose sequences an agent's KL check measures
    (`kl_ctrl.measure_on`): the training or the held-out ones, where the agent answers (a
    mixture team of more agents than G answers a G/n share of them)."""
    held_out = holdout_size(config, batch_size)
    measure_on = config.algorithm.kl_ctrl.measure_on
    prompts = held_out if measure_on == "held_out" else batch_size - held_out
    G, n = config.sat_seq.group_size, len(config.team.agents)
    if config.team.topology == "mixture" and n > G:
        return math.floor(prompts * G / n)
    return prompts


def certification_warning(config: RunConfig) -> str | None:
    """Where no outcome of a stage's KL check can certify the configured α = 1 − quantile at
    confidence 1 − η, even with no prompt above target_kl (design §4): what `satseq train` warns
    at start, with the batch that would."""
    if config.algorithm.name != "sat_seq":
        return None
    kl_ctrl = config.algorithm.kl_ctrl
    alpha, eta = 1.0 - kl_ctrl.quantile, kl_ctrl.eta
    B = config.trainer.batch_size
    n = checked_prompts(config, B)
    needed = units_to_certify(alpha, eta) if alpha > 0 else math.inf
    if n >= needed:
        return None
    best = clopper_pearson_upper(0, n, eta) if n else 1.0
    batch = B
    while needed < math.inf and checked_prompts(config, batch) < needed:
        batch += 1
    where = "held-out" if kl_ctrl.measure_on == "held_out" else "training"
    fix = f"trainer.batch_size ≥ {batch}" if needed < math.inf else "a quantile below 1"
    return (
        f"algorithm.kl_ctrl: each agent's KL check measures {n} {where} prompts a stage, which "
        f"certify at best α = {best:.3g} at confidence {1 - eta:g} (trust/certified_alpha), "
        f"not the configured 1 − quantile = {alpha:g}: that needs {needed} prompts ({fix})"
    )


TERMS_PREFIX = "cert/terms/"
GAIN_KEY = "cert/heldout_gain"


class HeldOut:
    """The stage's held-out rows with their log-probs under the stage-start weights (logp_cur)
    and under the final weights of each token's owner (logp_new), [n, T] each."""

    def __init__(self, batch: StageBatch, logp_cur: torch.Tensor, logp_new: torch.Tensor):
        self.rows = list(range(batch.n_train, len(batch.trajectories)))
        self.batch = batch
        self.logp_cur = logp_cur[self.rows]
        self.logp_new = logp_new[self.rows]
        self.R = batch.rewards[self.rows]
        self.prompts = torch.tensor([batch.trajectories[r].prompt_index for r in self.rows])

    def owned_by(self, agents: list[int]) -> torch.Tensor:
        """[n, T]: 1 on the held-out rows' tokens that `agents` wrote."""
        return self.batch.owned_by(agents)[self.rows]

    def log_ratio(self, agents: list[int]) -> torch.Tensor:
        """[n]: Σ over `agents`' tokens of (logp_new − logp_cur), each row's sequence log-ratio."""
        return masked_sum(self.logp_new - self.logp_cur, self.owned_by(agents), dim=-1)


def bandit_bound(config: RunConfig, held_out: HeldOut, agents: list[int], baseline_reward: float):
    """J(π') − J(π_start) ≥ lower_bound on the held-out rows where π' moves `agents` to their
    final weights (w = exp of their sequence log-ratio); rows none of them wrote count with
    w = 1 (no change)."""
    cert = config.algorithm.certificate
    return bandit_lower_bound(
        held_out.log_ratio(agents),
        held_out.R,
        b=baseline_reward,
        R_min=R_MIN,
        R_max=R_MAX,
        w_max=cert.w_max,
        delta_conf=cert.delta_conf,
        inequality=cert.inequality,
        prompts=held_out.prompts,
    )


def team_certificate(
    config: RunConfig, held_out: HeldOut, n_agents: int, baseline_reward: float
) -> dict[str, float]:
    """The whole team's bandit bound (J(π_new) − J(π_start) ≥ lower_bound w.p. 1 − δ_conf)."""
    bound = bandit_bound(config, held_out, list(range(n_agents)), baseline_reward)
    return {
        "estimate": bound.estimate,
        "deviation": bound.deviation,
        "truncation_bias": bound.truncation_bias,
        "lower_bound": bound.lower_bound,
        "n": bound.n,
    }


def agent_certificate(
    config: RunConfig,
    held_out: HeldOut,
    i: int,
    updated_before: list[int],
    group_size: int,
    baseline_reward: float,
) -> dict[str, float]:
    """Agent i's held-out gain estimate and its theorem terms, as per-agent metrics.

    On the held-out rows holding agent i's tokens: u = its sequence log-ratio under its update,
    c the truncated IS weights of the agents updated before it, A the held-out groups'
    c-weighted advantages, δ_i the mean per-sequence KL(π_θ ‖ π_cur) over its tokens (k3 on
    the held-out samples: no exact vocabulary pass is run for them)."""
    s = config.sat_seq
    own = held_out.owned_by([i])
    has = own.sum(-1) > 0
    before = held_out.owned_by(updated_before)
    c = truncated_is_weights(held_out.logp_new, held_out.logp_cur, before, s.max_log_ratio)
    A = group_advantages(
        held_out.R.view(-1, group_size), weights=c.view(-1, group_size), A_clip=s.A_clip
    ).advantages.flatten()
    u = held_out.log_ratio([i])
    seq_kl = sequence_kl(kl_k3(held_out.logp_new, held_out.logp_cur), own)
    N_i = int(has.sum())
    terms = theorem_terms(
        surrogate=surrogate_gain(u[has], A[has], c[has]) if N_i else 0.0,
        delta_i=float(seq_kl[has].mean()) if N_i else 0.0,
        A_max=s.A_clip,
        gamma=config.algorithm.gamma,
        zeta_i=truncation_bias(held_out.log_ratio(updated_before)[has], c[has], s.A_clip)
        if N_i
        else 0.0,
        N_i=N_i,
        n_agents=int(held_out.batch.owns.shape[0]),
        delta_conf=config.algorithm.certificate.delta_conf,
        w_max=config.algorithm.certificate.w_max,
    )
    gain = bandit_bound(config, held_out, [i], baseline_reward).estimate if N_i else 0.0
    return {
        GAIN_KEY: gain,
        f"{TERMS_PREFIX}information_gain": terms.information_gain,
        f"{TERMS_PREFIX}occupancy_shift": terms.occupancy_shift,
        f"{TERMS_PREFIX}estimator_bias": terms.estimator_bias,
        f"{TERMS_PREFIX}finite_sample": terms.finite_sample,
    }


def certificate_record(
    bandit: dict[str, float] | None, per_agent: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """The stage's line of certificates.jsonl: the bandit bound, and each agent's held-out gain
    estimate and theorem terms."""
    return {
        "bandit": bandit,
        "agents": {
            name: {
                key.removeprefix(TERMS_PREFIX).removeprefix("cert/"): value
                for key, value in values.items()
                if key.startswith("cert/")
            }
            for name, values in per_agent.items()
        },
    }
