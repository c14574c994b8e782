"""Per-token log-probabilities from logits at a sampling temperature."""

from __future__ import annotations

import torch


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log π(y_t | y_<t) at `temperature`.

    logits [B, T, V] are the model's outputs for positions that predict tokens [B, T].
    The behaviour log-probs logp_cur must be taken at the sampling temperature (DESIGN §4),
    because that is the distribution the rollout engine sampled from.
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
