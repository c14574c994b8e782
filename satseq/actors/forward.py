"""Teacher-forced forward passes over padded trajectories (the learner's view of a batch)."""

from __future__ import annotations

import torch

from satseq.actors.trajectory import PaddedBatch
from satseq.algo.logprobs import token_logprobs


def response_logits(model: torch.nn.Module, batch: PaddedBatch) -> torch.Tensor:
    """Logits that predict each response token, [N, T, V].

    Sequences are left-aligned and right-padded, so default position ids are correct; the logit
    for response token t sits at position response_start + t − 1.
    """
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    N, L, V = logits.shape
    T = batch.response_ids.shape[1]
    positions = (batch.response_start.unsqueeze(1) - 1 + torch.arange(T)).clamp(0, L - 1)
    positions = positions.to(logits.device)
    return logits.gather(1, positions.unsqueeze(-1).expand(N, T, V))


def response_logprobs(
    model: torch.nn.Module, batch: PaddedBatch, temperature: float
) -> torch.Tensor:
    """log π(y_t | y_<t) of every response token at the sampling temperature, [N, T].

    Padding positions hold junk values; mask them with batch.response_mask.
    """
    logits = response_logits(model, batch)
    return token_logprobs(logits, batch.response_ids.to(logits.device), temperature)
