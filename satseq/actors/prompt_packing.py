"""A shared prompt computed once: the rows of a micro-batch that share their prompt (a GRPO
group's G samples, a mixture team's samples of one prompt) packed into one sequence.

A teacher-forced pass over padded rows [N, L] computes each prompt once per row. Packed, the
rows that share a prompt become one sequence prompt ‖ response_1 ‖ … ‖ response_k, under a block
mask (each response attends to the prompt and to its own earlier tokens, never to another
response) and with position ids that restart after the prompt for every response. Each token
then sees exactly the keys, values and positions it sees in its own row, so every hidden state
is the one the row computes alone (to float rounding: the same sums in another order), and the
gradients into the shared prompt are the sum over its rows, as before. Only the number of
tokens changes: P + Σ R_i instead of k·(P + max R).

It applies where it saves compute (`pack_shared_prompts` compares the two layouts' linear and
attention FLOPs: a block mask makes attention dense over the packed length, so long responses
are better left in rows of their own) and where the model takes a 4D mask as it is: SDPA
attention, no sliding window, an architecture listed in PACKABLE_MODELS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from satseq.actors.trajectory import PaddedBatch

PACKABLE_MODELS = frozenset({"llama", "qwen2", "qwen3"})
"""Architectures whose transformers implementation passes a 4D mask and position ids through
to SDPA unchanged (checked by tests/actors/test_prompt_packing.py)."""

PADDING = -2  # segment of a packed row's padding; the prompt's is -1, a response's its row


@dataclass(frozen=True)
class PackedBatch:
    """A micro-batch packed by shared prompt: input_ids and position_ids [n, L'], the block
    mask [n, 1, L', L'] (True: may attend), and for every state s_t of every trajectory
    (before response token t, as `response_hidden_states` reads them) its packed row and
    position, `state_rows` and `state_positions` [N, T]."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    state_rows: torch.Tensor
    state_positions: torch.Tensor

    def to(self, device: str | torch.device) -> PackedBatch:
        return PackedBatch(*(tensor.to(device) for tensor in vars(self).values()))


def packable(config) -> bool:
    """Whether `config`'s model takes a packed batch: SDPA attention over full causal layers."""
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    sliding = getattr(config, "sliding_window", None) is not None and getattr(
        config, "use_sliding_window", True
    )
    return (
        getattr(config, "model_type", None) in PACKABLE_MODELS
        and getattr(config, "_attn_implementation", None) == "sdpa"
        and all(kind == "full_attention" for kind in layer_types)
        and not sliding
    )


def pack_shared_prompts(batch: PaddedBatch, config) -> PackedBatch | None:
    """`batch` with the rows that share a prompt packed together, or None where no two rows
    share one, the model cannot take it (`packable`), or it would not save compute."""
    if not packable(config):
        return None
    ids = batch.input_ids.cpu()
    starts = batch.response_start.tolist()
    lengths = batch.response_lengths.tolist()
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, start in enumerate(starts):
        groups.setdefault(tuple(ids[row, :start].tolist()), []).append(row)
    if len(groups) == len(starts) or min(starts) == 0:
        return None
    packed_lengths = [len(p) + sum(lengths[r] for r in rows) for p, rows in groups.items()]
    separate = pass_flops(config, len(starts), ids.shape[1])
    if pass_flops(config, len(groups), max(packed_lengths)) >= separate:
        return None
    return _pack(ids, groups, lengths, batch.response_ids.shape[1], batch.input_ids.device)


def pass_flops(config, rows: int, length: int) -> float:
    """A forward pass's FLOPs over `rows` × `length` tokens, roughly: per token and layer 2 ×
    the layer's weights (≤ 4·H² in attention, 3·H·I in the MLP), per (query, key) pair and
    layer 4·H (scores and values), every pair (a mask makes attention dense)."""
    H, layers = config.hidden_size, config.num_hidden_layers
    linear = 2 * (4 * H * H + 3 * H * getattr(config, "intermediate_size", 4 * H))
    return rows * layers * (linear * length + 4 * H * length * length)


def _pack(ids, groups, lengths, T: int, device) -> PackedBatch:
    """One packed row per prompt group, padded to the longest; each trajectory's states."""
    sequences, segments, positions = [], [], []
    state_rows = torch.zeros(len(lengths), T, dtype=torch.long)
    state_positions = torch.zeros(len(lengths), T, dtype=torch.long)
    for packed_row, (prompt, rows) in enumerate(groups.items()):
        P = len(prompt)
        tokens, segment, position = list(prompt), [-1] * P, list(range(P))
        for row in rows:
            R = lengths[row]
            # s_0 is the prompt's last state; s_t (t ≥ 1) follows response token t − 1
            state_rows[row] = packed_row
            state_positions[row] = P - 1
            state_positions[row, 1:R] = len(tokens) + torch.arange(R - 1)
            tokens += ids[row, P : P + R].tolist()
            segment += [row] * R
            position += range(P, P + R)
        sequences.append(tokens)
        segments.append(segment)
        positions.append(position)
    width = max(len(s) for s in sequences)

    def padded(values: list[list[int]], fill: int) -> torch.Tensor:
        return torch.tensor([v + [fill] * (width - len(v)) for v in values], dtype=torch.long)

    segment = padded(segments, PADDING)
    order = torch.arange(width)
    causal = order.unsqueeze(1) >= order.unsqueeze(0)  # [query, key]
    # a query's own part or the prompt (every query sees itself: no row of the mask is empty)
    same_part = (segment.unsqueeze(-1) == segment.unsqueeze(-2)) | (segment == -1).unsqueeze(-2)
    mask = causal & same_part
    return PackedBatch(
        input_ids=padded(sequences, 0).to(device),
        position_ids=padded(positions, 0).to(device),
        attention_mask=mask.unsqueeze(1).to(device),
        state_rows=state_rows.to(device),
        state_positions=state_positions.to(device),
    )
