"""An agent's stage batch as its learner computes on it: the micro-batches of its rows (each
with agent i's token mask and its share of the loss's normaliser; sharded, this rank's share
with stand-ins that keep the collectives in step), the shuffled mini-batches of an epoch, and
π_cur's reference for the exact KL."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from satseq.actors.forward import response_token_index
from satseq.actors.learner.policy import AgentPolicy
from satseq.actors.packing import PackedBatch, layout_tokens, pack_batch
from satseq.actors.trajectory import PaddedBatch, Trajectory
from satseq.algo.lm_head import OutputLayer
from satseq.algo.masks import owner_mask


@dataclass
class MicroBatch:
    """One micro-batch: its rows of the batch, tensors on the learner's device, agent i's token
    mask [n, T_mb] and its share of its step's loss normaliser. A sharded rank's stand-in
    (real=False) has weight 0 and its results are dropped.

    What the step needs to know of the batch on the host is worked out from the host's copy,
    so that the device's is never read back: each row's response length, whether it holds
    agent i's tokens, the flat positions of the response tokens in [n, T_mb] (indexing by a
    bool mask on an accelerator waits for the device to count it), the packed layout, and of
    that layout the positions holding a token and all positions computed (padding too)."""

    rows: list[int]
    batch: PaddedBatch
    mask: torch.Tensor
    weight: float
    lengths: list[int]
    owns: list[bool]
    token_index: torch.Tensor
    packed: PackedBatch | None
    tokens: int
    positions: int
    real: bool = True

    @staticmethod
    def on_host(
        rows: list[int], batch: PaddedBatch, mask: torch.Tensor, weight: float, config
    ) -> MicroBatch:
        """`batch` (on the host) with its host-side layout; `config`: the model's (packing)."""
        packed = pack_batch(batch, config)
        tokens, positions = layout_tokens(batch, packed)
        return MicroBatch(
            rows,
            batch,
            mask,
            weight,
            lengths=batch.response_lengths.tolist(),
            owns=(mask.sum(-1) > 0).tolist(),
            token_index=response_token_index(batch),
            packed=packed,
            tokens=tokens,
            positions=positions,
        )

    def to(self, device: torch.device, weight: float, real: bool) -> MicroBatch:
        return dataclasses.replace(
            self,
            batch=self.batch.to(device),
            mask=self.mask.to(device),
            token_index=self.token_index.to(device),
            packed=None if self.packed is None else self.packed.to(device),
            weight=weight,
            real=real,
        )


@dataclass
class StageReference:
    """What the exact KL needs of π_cur (the stage-start policy): its output layer, and its last
    hidden states at each trajectory's response states ([T_row, H] per row), taken while π_θ is
    still π_cur instead of from a second model."""

    layer: OutputLayer | None = None
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)

    def record(self, mb: MicroBatch, hidden: torch.Tensor, layer: OutputLayer, dtype) -> None:
        """π_cur at micro-batch `mb`'s response states (hidden [M, H], row-major)."""
        if self.layer is None:
            self.layer = layer.detached_copy(dtype)
        for row, states in zip(mb.rows, hidden.detach().split(mb.lengths), strict=True):
            self.hidden.setdefault(row, states.to(dtype))

    def states(self, mb: MicroBatch) -> torch.Tensor:
        """π_cur's hidden states at `mb`'s response states, [M, H] row-major."""
        return torch.cat([self.hidden[row] for row in mb.rows])


def agent_micro_batches(
    policy: AgentPolicy, trajectories: list[Trajectory], rows: list[int] | None = None
) -> tuple[list[MicroBatch], int]:
    """This rank's micro-batches of `rows` (default: every trajectory, in order) that hold
    agent i's tokens (sharded: its share, with stand-ins), each weighted by its share of the
    loss's normaliser (tokens or sequences) over all of them; and the agent's token count."""
    spec = policy.spec
    micro_batches = []
    for mb_rows, batch in policy.micro_batches(trajectories, rows):  # on the host
        mask = owner_mask(batch.owner_ids, [spec.agent_index], batch.response_mask)
        count = mask.sum() if spec.loss.aggregation == "token_mean" else (mask.sum(-1) > 0).sum()
        if count > 0:
            config = policy.trunk.model.config
            micro_batches.append(MicroBatch.on_host(mb_rows, batch, mask, float(count), config))
    total = sum(mb.weight for mb in micro_batches)
    tokens = int(sum(float(mb.mask.sum()) for mb in micro_batches))
    mine = [
        mb.to(policy.device, mb.weight / total if real else 0.0, real)
        for mb, real in policy.group.mine(micro_batches)
    ]
    return mine, tokens


def every_rank(policy: AgentPolicy, parts: list) -> Iterator:
    """This rank's `parts` and, sharded, every other rank's too (rank order)."""
    return (part for parts_of_rank in policy.group.gather(parts) for part in parts_of_rank)


def fill_rows(target: torch.Tensor, parts: Iterable[tuple[list[int], torch.Tensor]]) -> None:
    """`target[rows, :T] = values` for each part (rows, values [n, T]) of the batch."""
    for rows, values in parts:
        target[rows, : values.shape[1]] = values


def padding_fraction(micro_batches: list[MicroBatch]) -> float:
    """The share of the positions a pass over `micro_batches` computes that are padding (in
    their packed layout where they pack); NaN without micro-batches (sharded: this rank's)."""
    positions = sum(mb.positions for mb in micro_batches if mb.real)
    tokens = sum(mb.tokens for mb in micro_batches if mb.real)
    return 1 - tokens / positions if positions else float("nan")


def agent_rows(policy: AgentPolicy, trajectories: list[Trajectory]) -> list[int]:
    """The rows whose trajectory holds a token agent i wrote (and is trained on)."""
    i = policy.spec.agent_index
    return [
        row
        for row, t in enumerate(trajectories)
        if any(o == i and m for o, m in zip(t.owner_ids, t.response_mask, strict=True))
    ]


def mini_batch_rows(policy: AgentPolicy, rows: list[int]) -> list[list[int]]:
    """`rows` shuffled into mini-batches of about `mini_batch_size` trajectories, with a seed
    every rank shares (drawn from rank 0's torch RNG, which resume restores). The rows are dealt
    into round(N / mini_batch_size) mini-batches (at least one) of sizes that differ by at most
    one, so no step is taken on a remainder of a row or two (9 rows by 4: 5 and 4, not 4, 4, 1)."""
    seed = policy.group.gather(int(torch.randint(2**62, ())))[0]
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))
    count = mini_batch_count(len(rows), policy.spec.mini_batch_size)
    return [[rows[i] for i in part.tolist()] for part in order.tensor_split(count)]


def mini_batch_count(n_rows: int, mini_batch_size: int | None) -> int:
    """An epoch's optimiser steps: round(n_rows / mini_batch_size), at least 1; 1 without a
    mini-batch size (one step over the whole batch)."""
    if mini_batch_size is None:
        return 1
    return max(1, round(n_rows / mini_batch_size))
