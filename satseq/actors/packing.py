"""Padding-free micro-batches: a micro-batch's trajectories laid end to end in a few rows, each
shared prompt computed once.

A teacher-forced pass over padded rows [N, L] computes every row to the longest one's length,
and a prompt that several rows share (a GRPO group's G samples, a mixture team's samples of one
problem) once a row. Packed, the rows that share a prompt become one document prompt ‖
response_1 ‖ … ‖ response_k, and the documents are laid end to end into rows (first-fit
decreasing), under a block mask: a token attends to its own document's prompt and to the earlier
tokens of its own response, never to another response or another document, and position ids
restart with each document and continue the prompt in each response. Each token then sees
exactly the keys, values and positions it sees in its own row, so every hidden state is the one
the row computes alone (to float rounding: the same sums in another order), and the gradients
into a shared prompt are the sum over its rows. Only the number of tokens changes.

The layout is chosen by FLOPs (`pass_flops`). A block mask makes attention dense over a packed
row, so the rows are as wide as the longest document: one document per prompt group where that
is cheapest, else one per trajectory (the padding removed, the prompts not shared: long
responses to a short prompt), else the padded rows. It applies where the model takes a 4D mask
as it is: SDPA attention, no sliding window, an architecture listed in PACKABLE_MODELS.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from satseq.actors.trajectory import PaddedBatch

PACKABLE_MODELS = frozenset({"llama", "qwen2", "qwen3"})
"""Architectures whose transformers implementation passes a 4D mask and position ids through
to SDPA unchanged (checked by tests/actors/test_packing.py)."""

PROMPT = -1  # the part of a document's prompt; a response's part is its trajectory's row
PADDING = -2  # the document and the part of a packed row's padding

Document = tuple[int, list[int]]
"""A prompt's length and the rows (trajectories) whose responses follow it."""


@dataclass(frozen=True)
class PackedBatch:
    """A micro-batch packed into rows: input_ids and position_ids [n, L'], the block mask
    [n, 1, L', L'] (True: may attend), and for every state s_t of every trajectory (before
    response token t, as `response_hidden_states` reads them) its packed row and position,
    `state_rows` and `state_positions` [N, T]; `tokens`: the positions that hold a token, not
    padding."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    state_rows: torch.Tensor
    state_positions: torch.Tensor
    tokens: int

    def to(self, device: str | torch.device) -> PackedBatch:
        tensors = {k: v.to(device) for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        return dataclasses.replace(self, **tensors)


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


def pack_batch(batch: PaddedBatch, config) -> PackedBatch | None:
    """`batch` packed into rows, by shared prompt where that is cheaper, or None where the
    padded rows cost no more or the model cannot take a packed batch (`packable`)."""
    if not packable(config) or min(batch.response_start.tolist()) == 0:
        return None  # (s_0 of a response without a prompt is no token's state)
    lengths = batch.response_lengths.tolist()
    shared = _documents(batch, share_prompts=True)
    separate = [] if len(shared) == len(lengths) else [_documents(batch, share_prompts=False)]
    layouts = [_rows_of(documents, lengths) for documents in (shared, *separate)]
    costs = [pass_flops(config, len(rows), width) for rows, width in layouts]
    best = min(range(len(layouts)), key=costs.__getitem__)
    if costs[best] >= pass_flops(config, *batch.input_ids.shape):
        return None
    return _pack(batch, layouts[best][0])


def pack(batch: PaddedBatch, share_prompts: bool) -> PackedBatch:
    """`batch` packed into rows, a document per prompt group (`share_prompts`) or per
    trajectory, whatever it costs. Every response needs a prompt."""
    lengths = batch.response_lengths.tolist()
    return _pack(batch, _rows_of(_documents(batch, share_prompts), lengths)[0])


def pass_flops(config, rows: int, length: int) -> float:
    """A forward pass's FLOPs over `rows` × `length` tokens, roughly: per token and layer 2 ×
    the layer's weights (≤ 4·H² in attention, 3·H·I in the MLP), per (query, key) pair and
    layer 4·H (scores and values), every pair (a mask makes attention dense)."""
    H, layers = config.hidden_size, config.num_hidden_layers
    linear = 2 * (4 * H * H + 3 * H * getattr(config, "intermediate_size", 4 * H))
    return rows * layers * (linear * length + 4 * H * length * length)


def layout_tokens(batch: PaddedBatch, packed: PackedBatch | None) -> tuple[int, int]:
    """The positions a pass over `batch` computes that hold a token, and all it computes (the
    padding too), in the layout it runs: `packed`, else the padded rows."""
    if packed is None:
        return int(batch.attention_mask.sum()), batch.input_ids.numel()
    return packed.tokens, packed.input_ids.numel()


def _documents(batch: PaddedBatch, share_prompts: bool) -> list[Document]:
    """`batch`'s documents: one per prompt group (`share_prompts`), else one per trajectory."""
    starts = batch.response_start.tolist()
    if not share_prompts:
        return [(start, [row]) for row, start in enumerate(starts)]
    ids = batch.input_ids.cpu()
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, start in enumerate(starts):
        groups.setdefault(tuple(ids[row, :start].tolist()), []).append(row)
    return [(starts[rows[0]], rows) for rows in groups.values()]


def _rows_of(documents: list[Document], lengths: list[int]) -> tuple[list[list[Document]], int]:
    """The documents laid into rows as wide as the longest (first-fit decreasing), and that
    width."""

    def size(document: Document) -> int:
        return document[0] + sum(lengths[row] for row in document[1])

    width = max(size(d) for d in documents)
    rows: list[list[Document]] = []
    free: list[int] = []
    for document in sorted(documents, key=size, reverse=True):
        fits = next((k for k, room in enumerate(free) if room >= size(document)), None)
        if fits is None:
            rows.append([])
            free.append(width)
            fits = len(rows) - 1
        rows[fits].append(document)
        free[fits] -= size(document)
    return rows, width


def _pack(batch: PaddedBatch, rows: list[list[Document]]) -> PackedBatch:
    """The packed rows, padded to the longest; each trajectory's states in them."""
    ids, lengths = batch.input_ids.cpu(), batch.response_lengths.tolist()
    T, device = batch.response_ids.shape[1], batch.input_ids.device
    sequences, positions, documents, parts = [], [], [], []
    state_rows = torch.zeros(len(lengths), T, dtype=torch.long)
    state_positions = torch.zeros(len(lengths), T, dtype=torch.long)
    for packed_row, row_documents in enumerate(rows):
        tokens, position, document, part = [], [], [], []
        for P, members in row_documents:
            name = members[0]  # the document's: each trajectory is in one document
            tokens += ids[name, :P].tolist()
            position += range(P)
            document += [name] * P
            part += [PROMPT] * P
            prompt_end = len(tokens)
            for row in members:
                R = lengths[row]
                # s_0 is the prompt's last state; s_t (t ≥ 1) follows response token t − 1
                state_rows[row] = packed_row
                state_positions[row] = prompt_end - 1
                state_positions[row, 1:R] = len(tokens) + torch.arange(R - 1)
                tokens += ids[row, P : P + R].tolist()
                position += range(P, P + R)
                document += [name] * R
                part += [row] * R
        sequences.append(tokens)
        positions.append(position)
        documents.append(document)
        parts.append(part)
    width = max(len(s) for s in sequences)

    def padded(values: list[list[int]], fill: int) -> torch.Tensor:
        return torch.tensor([v + [fill] * (width - len(v)) for v in values], dtype=torch.long)

    document, part = padded(documents, PADDING), padded(parts, PADDING)
    order = torch.arange(width)
    causal = order.unsqueeze(1) >= order.unsqueeze(0)  # [query, key]
    # within a document, a query's own part or the prompt; padding sees padding (every query
    # sees itself: no row of the mask is empty)
    same_document = document.unsqueeze(-1) == document.unsqueeze(-2)
    same_part = (part.unsqueeze(-1) == part.unsqueeze(-2)) | (part == PROMPT).unsqueeze(-2)
    mask = causal & same_document & same_part
    return PackedBatch(
        input_ids=padded(sequences, 0).to(device),
        position_ids=padded(positions, 0).to(device),
        attention_mask=mask.unsqueeze(1).to(device),
        state_rows=state_rows.to(device),
        state_positions=state_positions.to(device),
        tokens=sum(len(s) for s in sequences),
    )
