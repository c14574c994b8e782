"""Teacher-forced forward passes over padded trajectories (the learner's view of a batch)."""

from __future__ import annotations

import torch

from satseq.actors.trajectory import PaddedBatch
from satseq.algo.logprobs import token_logprobs


def response_logits(model: torch.nn.Module, batch: PaddedBatch) -> torch.Tensor:
    """Logits that predict each response token, [N, T, V]."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return _at_response_states(logits, batch)


def response_hidden_states(model: torch.nn.Module, batch: PaddedBatch) -> torch.Tensor:
    """The last hidden state of each state s_t, before response token t is chosen, [N, T, H]
    (what a value head V(s_t) reads)."""
    hidden = model.base_model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask
    ).last_hidden_state
    return _at_response_states(hidden, batch)


def _at_response_states(per_position: torch.Tensor, batch: PaddedBatch) -> torch.Tensor:
    """[N, L, D] per input position → [N, T, D] at the state before each response token.

    Sequences are left-aligned and right-padded, so default position ids are correct; the state
    before response token t is position response_start + t − 1.
    """
    N, L, D = per_position.shape
    T = batch.response_ids.shape[1]
    positions = (batch.response_start.unsqueeze(1) - 1 + torch.arange(T)).clamp(0, L - 1)
    positions = positions.to(per_position.device)
    return per_position.gather(1, positions.unsqueeze(-1).expand(N, T, D))


def response_logprobs(
    model: torch.nn.Module, batch: PaddedBatch, temperature: float
) -> torch.Tensor:
    """log π(y_t | y_<t) of every response token at the sampling temperature, [N, T].

    Padding positions hold junk values; mask them with batch.response_mask.
    """
    logits = response_logits(model, batch)
    return token_logprobs(logits, batch.response_ids.to(logits.device), temperature)
