"""The science of satseq (design §4): pure torch and numpy, no Ray and no I/O.

Each equation is one small function named after what it computes.
"""

from satseq.algo.advantages import (
    GroupAdvantages,
    clip_advantages,
    gae,
    gae_group_advantages,
    group_advantages,
    spo_advantages,
    terminal_rewards,
)
from satseq.algo.certificate import (
    BanditCertificate,
    TheoremTerms,
    bandit_lower_bound,
    mean_lower_confidence,
    surrogate_gain,
    theorem_terms,
    truncation_bias,
)
from satseq.algo.eval_metrics import avg_at_k, maj_at_k, majority_vote, pass_at_k
from satseq.algo.importance import truncated_is_weights
from satseq.algo.kl import (
    certified_alpha,
    kl_exact,
    kl_k3,
    kl_quantile,
    sequence_kl,
    units_to_certify,
)
from satseq.algo.logprobs import token_logprobs
from satseq.algo.losses import (
    PolicyLoss,
    aggregate,
    clipped_surrogate,
    kl_penalty,
    log_ratio,
    policy_loss,
)
from satseq.algo.masks import NO_OWNER, masked_mean, masked_sum, owner_mask
from satseq.algo.projection import (
    chunked_distillation_kl,
    chunked_mixture_kl,
    geometric_mixture,
    mean_mixture_kl,
    mixture_kl_to_current,
    projection_lambda,
    projection_lambda_from_logprobs,
)
from satseq.algo.scheduler import AgentScheduler, order_by_score
from satseq.algo.spo import (
    BetaTracker,
    PrioritisedSampler,
    beta_prior,
    binarise_score,
    discounted_beta_update,
    kl_adaptive_rho,
    sampling_weights,
)
from satseq.algo.trust_region import (
    StepDecision,
    StepOutcome,
    TrustRegion,
)

__all__ = [
    "NO_OWNER",
    "AgentScheduler",
    "BanditCertificate",
    "BetaTracker",
    "GroupAdvantages",
    "PolicyLoss",
    "PrioritisedSampler",
    "StepDecision",
    "StepOutcome",
    "TheoremTerms",
    "TrustRegion",
    "aggregate",
    "avg_at_k",
    "bandit_lower_bound",
    "beta_prior",
    "binarise_score",
    "certified_alpha",
    "chunked_distillation_kl",
    "chunked_mixture_kl",
    "clip_advantages",
    "clipped_surrogate",
    "discounted_beta_update",
    "gae",
    "gae_group_advantages",
    "geometric_mixture",
    "group_advantages",
    "kl_adaptive_rho",
    "kl_exact",
    "kl_k3",
    "kl_penalty",
    "kl_quantile",
    "log_ratio",
    "maj_at_k",
    "majority_vote",
    "masked_mean",
    "masked_sum",
    "mean_lower_confidence",
    "mean_mixture_kl",
    "mixture_kl_to_current",
    "order_by_score",
    "owner_mask",
    "pass_at_k",
    "policy_loss",
    "projection_lambda",
    "projection_lambda_from_logprobs",
    "sampling_weights",
    "sequence_kl",
    "spo_advantages",
    "surrogate_gain",
    "terminal_rewards",
    "theorem_terms",
    "token_logprobs",
    "truncated_is_weights",
    "truncation_bias",
    "units_to_certify",
]
