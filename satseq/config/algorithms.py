"""The algorithms' sections: `algorithm:` (the KL control, the certificate), `sat_seq:`, `spo:`
and `grpo:`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from satseq.config.section import Section


class KLControlConfig(Section):
    """SAT-Seq's KL penalty and quantile trust region (design §4): an epoch whose KL quantile
    exceeds target_kl is undone and retried with a larger β and a smaller step."""

    kl_coef: float = Field(0.01, ge=0.0, description="initial β_i of the KL penalty")
    target_kl: float = Field(0.05, gt=0.0, description="trust region: max allowed KL quantile")
    quantile: float = Field(
        0.9, gt=0.0, le=1.0, description="quantile level 1 − α of per-sequence KL"
    )
    eta: float = Field(
        0.05,
        gt=0.0,
        lt=1.0,
        description="confidence 1 − η of the level each update certifies "
        "(trust/certified_alpha/<agent>: the Clopper–Pearson bound, prompts as units, on the "
        "share of prompts with a sequence KL > target_kl)",
    )
    measure_on: Literal["train", "held_out"] = Field(
        "train",
        description="the rows the KL check measures: train (the rows the step was fitted to, "
        "free: the pass also gives logp_hat) or held_out (the stage's held-out prompts, which "
        "the certified level needs to be valid; one more forward pass over them per attempt and "
        "one over the training rows at the end)",
    )
    beta_growth: float = Field(1.5, gt=1.0, description="β_i ← beta_growth·β_i on a violation")
    step_shrink: float = Field(
        0.5, gt=0.0, le=1.0, description="each retry scales the step size by this"
    )
    estimator: Literal["exact", "k3"] = Field(
        "exact",
        description="exact: the vocabulary KL(π_θ ‖ π_cur) from both logits; k3: Schulman's k3 "
        "on the sampled tokens (when the vocabulary does not fit)",
    )
    max_backtracks: int = Field(3, ge=0, description="an epoch gets 1 + max_backtracks attempts")
    on_exhausted: Literal["reject", "keep"] = Field(
        "reject", description="after the last failed attempt: reject the epoch, or keep it"
    )


class CertificateConfig(Section):
    """The per-stage PAC certificate: a lower bound on the stage's gain J(π') − J(π) in reward
    units, from prompts held out of the update."""

    delta_conf: float = Field(
        0.05, gt=0.0, lt=1.0, description="PAC confidence: bound holds w.p. 1 − δ"
    )
    w_max: float = Field(
        2.0, gt=1.0, description="truncation of the sequence ratio in the bandit bound"
    )
    inequality: Literal["bernstein", "hoeffding"] = Field(
        "bernstein",
        description="the deviation term: empirical Bernstein (Maurer & Pontil) or Hoeffding",
    )
    holdout_fraction: float = Field(
        0.25, ge=0.0, lt=1.0, description="prompts held out of the update for the bound"
    )


class AlgorithmConfig(Section):
    """The stage recipe, and the discount, KL control and certificate settings."""

    name: Literal["sat_seq", "spo", "grpo"] = Field(
        "sat_seq",
        description="the stage recipe (satseq/cluster/recipes/), for one agent or several",
    )
    gamma: float = Field(0.99, gt=0.0, lt=1.0, description="discount in the theorem terms and GAE")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE λ")
    kl_ctrl: KLControlConfig = Field(
        default_factory=KLControlConfig, description="SAT-Seq's KL penalty and trust region"
    )
    certificate: CertificateConfig = Field(
        default_factory=CertificateConfig, description="SAT-Seq's per-stage PAC certificate"
    )


class SatSeqConfig(Section):
    """SAT-Seq (arXiv 2605.05216): one agent updated at a time, truncated IS weights for the
    agents already updated this stage, a sequence-ratio PPO clip with a KL penalty."""

    epsilon: float = Field(0.2, gt=0.0, lt=1.0, description="PPO clip ε")
    A_clip: float = Field(5.0, gt=0.0, description="advantages are clipped to ±A_clip")
    group_size: int = Field(8, ge=2, description="G trajectories per prompt")
    ratio: Literal["seq", "token", "seq_mean"] = Field(
        "seq",
        description="seq: r = exp(sum of the agent's token log-ratios); token: a ratio per token; "
        "seq_mean: the length-normalised sequence ratio",
    )
    advantage: Literal["grpo", "gae"] = Field(
        "grpo", description="grpo: group-normalised rewards; gae: a per-agent value head + GAE"
    )
    baseline: Literal["team", "agent"] = Field(
        "team",
        description="grpo advantages' group: team (every sample of the prompt, whichever agent "
        "wrote it, IS-weighted: the official code's mixture) or agent (the agent's own samples "
        "of the prompt, so its advantages are centred on them)",
    )
    value_lr: float = Field(5e-3, gt=0.0, description="gae: the value head's AdamW lr")
    value_steps: int = Field(8, ge=1, description="gae: value-head steps per agent per stage")
    max_log_ratio: float = Field(5.0, gt=0.0, description="clamp of the IS log-ratio")
    scheduler: Literal["static", "random", "greedy_gain"] = Field(
        "static",
        description="each stage's agent order: static (team order), random (seeded by "
        "trainer.seed), greedy_gain (largest held-out gain of the last stage first; mean |A| at "
        "the first stage)",
    )


class SpoConfig(Section):
    """SPO (arXiv 2509.13232): one response per prompt, a Beta tracker per (agent, prompt) as
    the baseline, prioritised prompt sampling."""

    rho: Literal["constant", "kl"] = Field(
        "kl",
        description="the trackers' forgetting factor ρ: constant (rho_min) or kl "
        "(clamp(2^(−D/d_half), rho_min, rho_max), D the policy's change on the prompt)",
    )
    rho_min: float = Field(
        0.875,
        gt=0.0,
        lt=1.0,
        description="the smallest ρ (constant's ρ); the offline prior's weight is 1/(1 − rho_min)",
    )
    rho_max: float = Field(
        0.96, gt=0.0, lt=1.0, description="the largest ρ under kl, and ρ on a first visit"
    )
    d_half: float = Field(0.06, gt=0.0, description="D at which ρ halves")
    eps_low: float = Field(0.2, gt=0.0, lt=1.0, description="PPO clip below: r ≥ 1 − eps_low")
    eps_high: float = Field(0.28, gt=0.0, description="PPO clip above: r ≤ 1 + eps_high")
    dual_clip: float = Field(
        10.0, gt=1.0, description="dual clip c: a negative advantage's loss is at most c·|A|"
    )
    gamma_s: float = Field(0.0, ge=0.0, description="sampling weight exponent on N_eff")
    candidate_pool_size: int = Field(
        256,
        ge=1,
        description="prompts drawn uniformly each stage; B of them are then drawn by weight",
    )
    offline_values: str | None = Field(
        None, description="JSON {prompt: [scores]} from offline-values merge"
    )
    sample_unscored_prompts: bool = Field(
        True,
        description="draw prompts that have no offline scores (prior Beta(0.5, 0.5)); false: never",
    )

    @model_validator(mode="after")
    def _rho_order(self) -> SpoConfig:
        if self.rho_min > self.rho_max:
            raise ValueError(f"rho_min ({self.rho_min}) must not exceed rho_max ({self.rho_max})")
        return self


class GrpoConfig(Section):
    """GRPO, the baseline: G samples per prompt, group mean/std advantages, token-ratio PPO clip;
    agents update in parallel."""

    group_size: int = Field(8, ge=2, description="G samples per prompt and agent")
    eps_low: float = Field(0.2, gt=0.0, lt=1.0, description="PPO clip below: r ≥ 1 − eps_low")
    eps_high: float = Field(0.2, gt=0.0, description="PPO clip above: r ≤ 1 + eps_high")
    dr_grpo: bool = Field(False, description="Dr.GRPO: no division by the group std")
    measure_step_kl: bool = Field(
        False,
        description="log kl_quantile/<agent>, the KL quantile between the policy before and "
        "after each step: one more forward pass over the batch per step",
    )
