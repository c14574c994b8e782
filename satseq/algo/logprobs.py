"""Per-token log-probabilities from logits at a sampling temperature."""

from __future__ import annotations

import torch


def vocabulary_logprobs(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log π(· | y_<t) over the whole vocabulary at `temperature`, [B, T, V], in float32 (or
    the logits' wider dtype)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.log_softmax(logits / temperature, dim=-1)


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log π(y_t | y_<t) at `temperature`.

    logits [B, T, V] are the model's outputs for positions that predict tokens [B, T].
    The behaviour log-probs logp_cur must be taken at the sampling temperature (design §4),
    because that is the distribution the rollout engine sampled from.
    """
    return gather_token_logprobs(vocabulary_logprobs(logits, temperature), tokens)


def gather_token_logprobs(logp_vocabulary: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The log-probs [B, T] of `tokens` [B, T] from vocabulary log-probs [B, T, V]."""
    return logp_vocabulary.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
