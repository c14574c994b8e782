"""SPO: the per-prompt Beta value tracker and the prioritised prompt sampler (design §4 "SPO").

Single-stream Policy Optimization (arXiv 2509.13232) replaces the group baseline with a
persistent Beta(alpha, beta) tracker per key (in satseq, per ``(agent, raw problem text)``):

    p_hat = alpha / (alpha + beta)                       the baseline for A = r - p_hat
    alpha <- rho * alpha + r,  beta <- rho * beta + (1 - r)   discounted Beta posterior
    N_eff = alpha + beta                                 effective number of samples

The prior comes from offline samples of the base model, forgetting is either constant or
KL-adaptive, and prompts are drawn in proportion to sqrt(p_hat (1 - p_hat)), i.e. where the
outcome is most uncertain.

The runtime order for one visit of a key is:
    1. ``p_hat = tracker.p_hat(key)``                       baseline for the advantage
    2. actor step on the batch
    3. ``rho = tracker.rho(key, logp_now)``                  logp_now: the stored response
                                                             re-scored by the stepped policy
    4. ``tracker.update(key, reward, rho, logprobs, mask)``  logprobs of this visit's response
                                                             under the stepped policy
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch

# An offline score counts as a success when it is strictly above this value: verifiers return
# 0/1, and graded scores (partial credit) count only when they are more right than wrong.
SCORE_SUCCESS_THRESHOLD = 0.5

RHO_MODES = ("constant", "kl")


def binarise_score(score: float) -> int:
    """1 if ``score > SCORE_SUCCESS_THRESHOLD`` else 0."""
    return int(score > SCORE_SUCCESS_THRESHOLD)


def prior_sample_count(rho_min: float) -> float:
    """N0 = 1 / (1 - rho_min): the prior is worth the steady-state N_eff under rho_min."""
    return 1.0 / (1.0 - rho_min)  # SPO prior strength, design §4 "Prior"


def beta_prior(scores: Sequence[float], rho_min: float) -> tuple[float, float]:
    """(alpha0, beta0) from n0 offline scores of the base model; (0.5, 0.5) when there are none.

    alpha0 = N0 (s + 0.5) / (n0 + 1),  beta0 = N0 (n0 - s + 0.5) / (n0 + 1), with s the number
    of scores above SCORE_SUCCESS_THRESHOLD.
    """
    n0 = len(scores)
    if n0 == 0:
        return 0.5, 0.5  # Jeffreys prior, design §4 "Prior"
    s = sum(binarise_score(score) for score in scores)
    N0 = prior_sample_count(rho_min)
    alpha0 = N0 * (s + 0.5) / (n0 + 1)  # design §4 "Prior"
    beta0 = N0 * (n0 - s + 0.5) / (n0 + 1)  # design §4 "Prior"
    return alpha0, beta0


def discounted_beta_update(
    alpha: float, beta: float, reward: float, rho: float
) -> tuple[float, float]:
    """alpha <- rho alpha + r, beta <- rho beta + (1 - r)."""
    return rho * alpha + reward, rho * beta + (1.0 - reward)  # design §4 SPO "Tracker"


def kl_adaptive_rho(
    logp_prev: torch.Tensor,
    logp_now: torch.Tensor,
    mask: torch.Tensor,
    d_half: float = 0.06,
    rho_min: float = 0.875,
    rho_max: float = 0.96,
) -> float:
    """rho = clamp(2^(-D / D_half), rho_min, rho_max), D = token-mean |logp_prev - logp_now|.

    The further the policy moved on the key's last response since it was stored, the more
    of the old evidence is forgotten; D = D_half halves it (before clamping).

    Args:
        logp_prev: [T] log-probs of the stored response, stored after the previous visit.
        logp_now: [T] log-probs of the same tokens under the current policy.
        mask: [T] 1 for response tokens, 0 for tokens not trained on (prompt, tool output).
            A mask with no ones gives D = 0.
    """
    logp_prev, logp_now = torch.as_tensor(logp_prev), torch.as_tensor(logp_now)
    if logp_prev.shape != logp_now.shape:
        raise ValueError(
            f"kl_adaptive_rho: logp_prev has shape {tuple(logp_prev.shape)} but logp_now has "
            f"{tuple(logp_now.shape)}; re-score exactly the stored response tokens"
        )
    mask = torch.as_tensor(mask, dtype=torch.float64)
    abs_diff = (logp_prev.double() - logp_now.double()).abs()
    D = (abs_diff * mask).sum() / mask.sum().clamp_min(1.0)  # design §4 SPO "Forgetting"
    rho = 2.0 ** (-D.item() / d_half)  # design §4 SPO "Forgetting"
    return min(max(rho, rho_min), rho_max)


def sampling_weights(p_hat: np.ndarray, n_eff: np.ndarray, gamma_s: float = 0.0) -> np.ndarray:
    """w = sqrt(p_hat (1 - p_hat)) / N_eff^gamma_s + 0.05, elementwise over [n] keys."""
    return np.sqrt(p_hat * (1.0 - p_hat)) / n_eff**gamma_s + 0.05  # design §4 SPO "Sampling"


class BetaTracker:
    """Discounted Beta(alpha, beta) per key, plus the key's last response for KL forgetting.

    Keys are any hashable and picklable value, e.g. ``(agent_name, raw_problem_text)``. Every
    key is registered once with :meth:`add` (with its offline scores, if any) before use.
    """

    def __init__(
        self,
        rho_mode: str = "constant",
        rho_min: float = 0.875,
        rho_max: float = 0.96,
        d_half: float = 0.06,
    ):
        if rho_mode not in RHO_MODES:
            raise ValueError(f"spo rho mode {rho_mode!r} is unknown; use one of {RHO_MODES}")
        if not (0.0 < rho_min < 1.0 and rho_min <= rho_max <= 1.0):
            raise ValueError(
                f"spo rho needs 0 < rho_min < 1 and rho_min <= rho_max <= 1, got "
                f"rho_min={rho_min}, rho_max={rho_max}"
            )
        self.rho_mode = rho_mode
        self.rho_min = rho_min
        self.rho_max = rho_max
        self.d_half = d_half
        # key -> {"alpha", "beta", "has_prior", "response"}; "response" is None until the
        # first update, then {"logprobs": [T], "mask": [T], "token_ids": [T] | None}.
        self._entries: dict[Hashable, dict[str, Any]] = {}

    def add(self, key: Hashable, offline_scores: Sequence[float] | None = None) -> None:
        """Register ``key`` with the prior from its offline scores (none: alpha = beta = 0.5)."""
        if key in self._entries:
            raise ValueError(f"spo tracker: key {key!r} is already registered")
        scores = offline_scores or []
        alpha0, beta0 = beta_prior(scores, self.rho_min)
        self._entries[key] = {
            "alpha": alpha0,
            "beta": beta0,
            "has_prior": len(scores) > 0,
            "response": None,
        }

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[Hashable]:
        """All registered keys, in registration order."""
        return list(self._entries)

    def _entry(self, key: Hashable) -> dict[str, Any]:
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(
                f"spo tracker: key {key!r} was never registered; call tracker.add(key, scores) "
                "for every prompt before training"
            ) from None

    def alpha_beta(self, key: Hashable) -> tuple[float, float]:
        entry = self._entry(key)
        return entry["alpha"], entry["beta"]

    def p_hat(self, key: Hashable) -> float:
        """p_hat = alpha / (alpha + beta): the key's estimated success probability."""
        alpha, beta = self.alpha_beta(key)
        return alpha / (alpha + beta)  # design §4 SPO "Tracker"

    def n_eff(self, key: Hashable) -> float:
        """N_eff = alpha + beta: the discounted number of observations, prior included."""
        alpha, beta = self.alpha_beta(key)
        return alpha + beta

    def has_prior(self, key: Hashable) -> bool:
        return self._entry(key)["has_prior"]

    @property
    def n_without_prior(self) -> int:
        """How many registered keys had no offline scores (reported, never dropped silently)."""
        return sum(not entry["has_prior"] for entry in self._entries.values())

    def last_response(self, key: Hashable) -> dict[str, torch.Tensor | None] | None:
        """The stored ``{"logprobs", "mask", "token_ids"}`` of the key's last response, or None."""
        return self._entry(key)["response"]

    def rho(self, key: Hashable, logp_now: torch.Tensor | np.ndarray | None = None) -> float:
        """The forgetting factor for this visit of ``key``.

        ``constant``: rho_min. ``kl``: rho_max on a first visit, else
        :func:`kl_adaptive_rho` between the stored log-probs and ``logp_now`` ([T], the stored
        response re-scored by the current policy).
        """
        if self.rho_mode == "constant":
            return self.rho_min
        response = self._entry(key)["response"]
        if response is None:
            return self.rho_max  # first visit, design §4 SPO "Forgetting"
        if logp_now is None:
            raise ValueError(
                f"spo rho 'kl': key {key!r} has a stored response; pass logp_now, its tokens "
                "re-scored by the current policy"
            )
        return kl_adaptive_rho(
            response["logprobs"],
            logp_now,
            response["mask"],
            self.d_half,
            self.rho_min,
            self.rho_max,
        )

    def update(
        self,
        key: Hashable,
        reward: float,
        rho: float,
        logprobs: torch.Tensor | np.ndarray | None = None,
        mask: torch.Tensor | np.ndarray | None = None,
        token_ids: torch.Tensor | np.ndarray | None = None,
    ) -> None:
        """Fold one reward into the key's Beta and store this visit's response.

        Args:
            reward: r in [0, 1]; binary for SPO (fractions are kept as soft successes).
            rho: the forgetting factor, from :meth:`rho`.
            logprobs: [T] log-probs of this visit's response under the policy after the actor
                step; needed by ``rho: kl`` on the next visit. None stores nothing.
            mask: [T] response-token mask; None means every token counts.
            token_ids: [T] the response tokens, kept so the runtime can re-score them after a
                resume; optional.
        """
        if not 0.0 <= reward <= 1.0:
            raise ValueError(
                f"spo tracker: reward {reward} for key {key!r} is outside [0, 1]; binarise it "
                "first (satseq.algo.spo.binarise_score)"
            )
        entry = self._entry(key)
        entry["alpha"], entry["beta"] = discounted_beta_update(
            entry["alpha"], entry["beta"], reward, rho
        )
        if logprobs is not None:
            logprobs = torch.as_tensor(logprobs).detach().cpu().clone()
            if logprobs.dim() != 1:
                raise ValueError(
                    f"spo tracker: logprobs must be 1-D [T], got shape {tuple(logprobs.shape)}"
                )
            mask = torch.ones_like(logprobs) if mask is None else torch.as_tensor(mask)
            entry["response"] = {
                "logprobs": logprobs,
                "mask": mask.detach().cpu().clone(),
                "token_ids": None
                if token_ids is None
                else torch.as_tensor(token_ids).detach().cpu().clone(),
            }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: config and every key's Beta and stored response."""
        return {
            "rho_mode": self.rho_mode,
            "rho_min": self.rho_min,
            "rho_max": self.rho_max,
            "d_half": self.d_half,
            "entries": {
                key: {**entry, "response": _copy_response(entry["response"])}
                for key, entry in self._entries.items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rho_mode = state["rho_mode"]
        self.rho_min = state["rho_min"]
        self.rho_max = state["rho_max"]
        self.d_half = state["d_half"]
        self._entries = {
            key: {**entry, "response": _copy_response(entry["response"])}
            for key, entry in state["entries"].items()
        }


def _copy_response(response: dict[str, torch.Tensor | None] | None) -> dict | None:
    if response is None:
        return None
    return {name: None if t is None else t.clone() for name, t in response.items()}


class PrioritisedSampler:
    """Draws a batch of keys without replacement, in proportion to the SPO weights.

    A candidate pool of ``candidate_pool_size`` keys is drawn uniformly without replacement
    from the eligible keys (all of them if fewer); the batch is then drawn from the pool without
    replacement by sequential weighted draws (``numpy.random.Generator.choice(replace=False,
    p=w / sum(w))``). The pool keeps each draw O(pool) on large datasets.
    """

    def __init__(
        self,
        candidate_pool_size: int,
        gamma_s: float = 0.0,
        exclude_without_prior: bool = False,
        seed: int = 0,
    ):
        if candidate_pool_size < 1:
            raise ValueError(f"spo candidate_pool_size must be >= 1, got {candidate_pool_size}")
        self.candidate_pool_size = candidate_pool_size
        self.gamma_s = gamma_s
        self.exclude_without_prior = exclude_without_prior
        self.rng = np.random.default_rng(seed)

    def eligible_keys(
        self, tracker: BetaTracker, keys: Sequence[Hashable] | None = None
    ) -> list[Hashable]:
        """``keys`` (default: all registered), without the prior-less ones if so configured."""
        keys = tracker.keys() if keys is None else list(keys)
        if self.exclude_without_prior:
            keys = [key for key in keys if tracker.has_prior(key)]
        return keys

    def sample(
        self,
        tracker: BetaTracker,
        batch_size: int,
        keys: Sequence[Hashable] | None = None,
    ) -> list[Hashable]:
        """``batch_size`` distinct keys from ``keys`` (default: all registered keys)."""
        eligible = self.eligible_keys(tracker, keys)
        pool_size = min(self.candidate_pool_size, len(eligible))
        if batch_size > pool_size:
            raise ValueError(
                f"spo sampler: batch of {batch_size} from a candidate pool of {pool_size} "
                f"({len(eligible)} eligible keys, candidate_pool_size="
                f"{self.candidate_pool_size}); raise candidate_pool_size or add prompts"
            )
        pool = self.rng.choice(len(eligible), size=pool_size, replace=False)
        pool_keys = [eligible[i] for i in pool]
        p_hat = np.array([tracker.p_hat(key) for key in pool_keys])
        n_eff = np.array([tracker.n_eff(key) for key in pool_keys])
        w = sampling_weights(p_hat, n_eff, self.gamma_s)
        batch = self.rng.choice(pool_size, size=batch_size, replace=False, p=w / w.sum())
        return [pool_keys[i] for i in batch]

    def state_dict(self) -> dict[str, Any]:
        return {
            "candidate_pool_size": self.candidate_pool_size,
            "gamma_s": self.gamma_s,
            "exclude_without_prior": self.exclude_without_prior,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.candidate_pool_size = state["candidate_pool_size"]
        self.gamma_s = state["gamma_s"]
        self.exclude_without_prior = state["exclude_without_prior"]
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["rng"]
