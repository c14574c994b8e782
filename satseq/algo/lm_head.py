"""Token log-probs and the exact vocabulary KL from final hidden states, a chunk at a time.

The learner never materialises logits [batch, seq, vocabulary] (design §11 "Memory"): it takes
the last hidden state h_t [M, H] at the M response states only, and applies the output layer
W [V, H] (and its bias) to `chunk_tokens` states at a time. Each chunk's logits [m, V] live only
inside that chunk: under autograd the chunk is checkpointed, so its backward recomputes the
logits instead of keeping them, and the peak is one chunk's [m, V] in float32, not [M, V].

Precision (design §4): the output layer's matmul runs in float32 even under bf16 autocast
(`OutputLayer.float32_logits`, on by default: `trainer.fp32_head`). bf16 logits carry ~0.06 nats
of rounding at logit scales of 20–30, more than the KL budgets being checked, and the float32
log-softmax after a bf16 matmul cannot restore the lost bits. With it off, the matmul runs in
the autocast dtype and only the softmax is float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from satseq.algo.kl import kl_exact_from_logprobs
from satseq.algo.logprobs import gather_token_logprobs, vocabulary_logprobs

DEFAULT_CHUNK_TOKENS = 1024


@dataclass(frozen=True)
class OutputLayer:
    """The output projection logits = h W^T + b, as plain tensors (W [V, H], b [V] or None).
    float32_logits: the matmul runs in float32 whatever autocast says."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    float32_logits: bool = True

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """h W^T + b for hidden states [m, H] → [m, V]."""
        if not self.float32_logits:
            return torch.nn.functional.linear(hidden, self.weight, self.bias)
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        bias = None if self.bias is None else self.bias.to(dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            return torch.nn.functional.linear(hidden.to(dtype), self.weight.to(dtype), bias)

    def logprobs(self, hidden: torch.Tensor, temperature: float) -> torch.Tensor:
        """log π(· | s) at `temperature` for hidden states [m, H] → [m, V], float32 or wider."""
        return vocabulary_logprobs(self.logits(hidden), temperature)

    def detached_copy(self, dtype: torch.dtype | None = None) -> OutputLayer:
        """A frozen copy (the stage-start π_cur's output layer, kept while W trains), in
        `dtype` if given (under autocast a bf16 matmul runs in it anyway); with float32 logits
        the copy stays float32, so π_cur's logits are computed as π_θ's are."""
        dtype = torch.float32 if self.float32_logits else (dtype or self.weight.dtype)
        bias = None if self.bias is None else self.bias.detach().to(dtype, copy=True)
        return OutputLayer(self.weight.detach().to(dtype, copy=True), bias, self.float32_logits)


def _chunk_logprob_and_kl(
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    layer: OutputLayer,
    temperature: float,
    reference_hidden: torch.Tensor | None,
    reference: OutputLayer | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk: log π_θ(y_t | s_t) [m] and KL(π_θ ‖ π_cur)(s_t) [m] (zeros without reference)."""
    logp_vocabulary = layer.logprobs(hidden, temperature)
    logp = gather_token_logprobs(logp_vocabulary, tokens)
    if reference is None:
        return logp, torch.zeros_like(logp)
    with torch.no_grad():
        reference_logp = reference.logprobs(reference_hidden, temperature)
    return logp, kl_exact_from_logprobs(logp_vocabulary, reference_logp)  # design §4 KL


def map_chunks(
    chunk_fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
    rows: tuple[torch.Tensor, ...],
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """chunk_fn over `chunk_tokens` rows at a time of the per-state tensors `rows` (each [M, ...]),
    its per-state outputs ([m] each) concatenated to [M]. Under autograd (a row tensor requires
    grad) each of several chunks is checkpointed: backward recomputes its [m, V] logits instead
    of keeping them. One chunk is not: its backward follows its forward with nothing between
    them that would use the memory, so keeping its tensors peaks about as high as recomputing
    them, and saves the recomputation."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    M = rows[0].shape[0]
    chunks = -(-M // chunk_tokens)
    checkpointed = chunks > 1 and torch.is_grad_enabled() and any(r.requires_grad for r in rows)
    outputs = []
    for start in range(0, max(M, 1), chunk_tokens):  # M = 0: one empty chunk, typed outputs
        chunk = tuple(r[start : start + chunk_tokens] for r in rows)
        if checkpointed:
            outputs.append(checkpoint(chunk_fn, *chunk, use_reentrant=False))
        else:
            outputs.append(chunk_fn(*chunk))
    if isinstance(outputs[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*outputs, strict=True))
    return torch.cat(outputs)


def chunked_logprobs_and_kl(
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    layer: OutputLayer,
    temperature: float = 1.0,
    reference_hidden: torch.Tensor | None = None,
    reference: OutputLayer | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π_θ(y_t | s_t) [M] and, given π_cur's hidden states and output layer, the exact
    per-state KL(π_θ ‖ π_cur) [M] (else None).

    hidden, reference_hidden [M, H]; tokens [M]. Gradients flow into `hidden` and `layer`;
    π_cur's side is constant. Both outputs are float32 (or the inputs' wider dtype).
    """
    if (reference is None) != (reference_hidden is None):
        raise ValueError("the exact KL needs both π_cur's hidden states and its output layer")
    if reference is None:
        logp, _ = map_chunks(
            lambda h, y: _chunk_logprob_and_kl(h, y, layer, temperature, None, None),
            (hidden, tokens),
            chunk_tokens,
        )
        return logp, None
    return map_chunks(
        lambda h, y, h_cur: _chunk_logprob_and_kl(h, y, layer, temperature, h_cur, reference),
        (hidden, tokens, reference_hidden),
        chunk_tokens,
    )
