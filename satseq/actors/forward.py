"""Teacher-forced forward passes over padded trajectories (the learner's view of a batch).

The transformer runs once over prompt ‖ response; only the hidden states of the response
states go on to the output layer, chunk by chunk (`satseq.algo.lm_head`), so no logits tensor
[N, L, V] (nor [N, T, V]) ever exists. Every tensor made here follows the batch's device.
"""

from __future__ import annotations

import torch

from satseq.actors.packing import PackedBatch, pack_batch
from satseq.actors.trajectory import PaddedBatch
from satseq.algo.lm_head import DEFAULT_CHUNK_TOKENS, OutputLayer, chunked_logprobs_and_kl


def output_layer(model: torch.nn.Module, float32_logits: bool = True) -> OutputLayer:
    """The model's output projection (its lm_head) as tensors; float32_logits: its matmul in
    float32 under autocast (`trainer.fp32_head`)."""
    head = model.get_output_embeddings()
    if getattr(model.config, "final_logit_softcapping", None):
        raise ValueError(
            f"{type(model).__name__} soft-caps its logits; the learner's chunked log-probs "
            "implement a plain linear output layer only"
        )
    return OutputLayer(head.weight, head.bias, float32_logits)


class PolicyTrunk(torch.nn.Module):
    """A causal LM without its logits: forward returns the last hidden states [N, L, H] and
    the output layer, which the caller applies chunk by chunk. The output layer comes out of
    the forward so that a sharded model (FSDP2, `satseq.actors.sharding`) hands over its
    gathered weights, which its backward then reduces. fp32_head: the output layer computes
    its logits in float32 (`satseq.algo.lm_head.OutputLayer.float32_logits`)."""

    def __init__(self, model: torch.nn.Module, fp32_head: bool = True):
        super().__init__()
        self.model = model
        self.fp32_head = fp32_head

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        hidden = self.model.base_model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state
        layer = output_layer(self.model)
        return hidden, layer.weight, layer.bias


LAYOUT_FROM_BATCH = "from the batch"
"""`response_hidden_states`' default: work the packing out from the batch itself (reading the
batch back where it is on an accelerator)."""


def response_hidden_states(
    trunk: PolicyTrunk, batch: PaddedBatch, packed: PackedBatch | str | None = LAYOUT_FROM_BATCH
) -> tuple[torch.Tensor, OutputLayer]:
    """The last hidden state of each state s_t, before response token t is chosen, [N, T, H]
    (what the output layer and a value head V(s_t) read), and the output layer. The rows run
    packed, without padding and each shared prompt once (`satseq.actors.packing`), where that
    saves compute; `packed`: that layout, worked out beforehand from the batch on the host
    (None: the padded rows), so that the device's batch is never read back."""
    if packed == LAYOUT_FROM_BATCH:
        packed = pack_batch(batch, trunk.model.config)
    if packed is not None:
        hidden, weight, bias = trunk(packed.input_ids, packed.attention_mask, packed.position_ids)
        states = hidden[packed.state_rows, packed.state_positions]
        return states, OutputLayer(weight, bias, trunk.fp32_head)
    hidden, weight, bias = trunk(batch.input_ids, batch.attention_mask)
    N, L, H = hidden.shape
    T = batch.response_ids.shape[1]
    # sequences are left-aligned and right-padded, so default position ids are correct; the
    # state before response token t is position response_start + t − 1
    offsets = torch.arange(T, device=batch.response_start.device)
    positions = (batch.response_start.unsqueeze(1) - 1 + offsets).clamp(0, L - 1)
    layer = OutputLayer(weight, bias, trunk.fp32_head)
    return hidden.gather(1, positions.unsqueeze(-1).expand(N, T, H)), layer


def response_positions(batch: PaddedBatch) -> torch.Tensor:
    """Bool [N, T]: the positions that hold a response token (not padding)."""
    T = batch.response_ids.shape[1]
    offsets = torch.arange(T, device=batch.response_lengths.device)
    return offsets.unsqueeze(0) < batch.response_lengths.unsqueeze(1)


def response_token_index(batch: PaddedBatch) -> torch.Tensor:
    """The flat positions [M] of `response_positions(batch)` in [N, T], in the order a bool
    mask takes them: worked out on the host, they index a device's tensors without the device
    being read back (as indexing by a bool mask is, to count it)."""
    return response_positions(batch).flatten().nonzero().squeeze(-1)


def scatter_response(
    values: torch.Tensor, where: torch.Tensor, index: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token values [M] at the True entries of `where` [N, T] → [N, T], 0 elsewhere;
    `index`: those entries' flat positions (`response_token_index`), where known."""
    out = torch.zeros(where.shape, dtype=values.dtype, device=values.device)
    if index is None:
        out[where] = values
    else:
        out.view(-1)[index] = values
    return out


def response_logprobs(
    trunk: PolicyTrunk,
    batch: PaddedBatch,
    temperature: float,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """log π(y_t | y_<t) of every response token at the sampling temperature, [N, T] float32
    (0 at padding)."""
    where = response_positions(batch)
    hidden, layer = response_hidden_states(trunk, batch)
    logp, _ = chunked_logprobs_and_kl(
        hidden[where],
        batch.response_ids[where],
        layer,
        temperature,
        chunk_tokens=chunk_tokens,
    )
    return scatter_response(logp, where)
