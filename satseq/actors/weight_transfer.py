"""Weight sync over a collective (`rollout.weight_sync: collective`): the learner's rank 0
broadcasts its weights straight to the vLLM engines' workers, bucket by bucket, with no copy in
the object store. The engines take them through vLLM's weight-transfer API
(`init_weight_transfer_engine`, `start_weight_update`, `update_weights`,
`finish_weight_update`), which reloads each layer as its weights arrive.

Two backends, one lifecycle:

- `nccl` (learner and engines on GPUs): vLLM's own NCCL transfer engine in the workers, and on
  the learner vLLM's trainer endpoint and packed producer (buffers of the bucket size).
- `gloo` (on the CPU): a torch gloo group in place of NCCL, and one flat buffer per bucket
  (`bucket_plan`, which both sides compute from the same manifest). Its worker side is
  `satseq.actors.engines.vllm_transfer`, registered with vLLM's transfer-engine factory.

The group is rank 0 (the sender) and one rank per engine worker, `rank_offset` 1, 2, ... in
rollout-actor order. This module is what the learner needs; it imports no vLLM on the CPU.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from satseq.config.team_plan import TransferBackend

TRANSFER_TIMEOUT = datetime.timedelta(minutes=10)
"""How long a rank waits for the others to join the group or a broadcast (a dead peer's closed
sockets end a gloo wait sooner)."""
PACKED_BUFFERS = 2
"""NCCL: buffers in flight at once (one is packed while the other is broadcast)."""


@dataclass(frozen=True)
class TensorSpec:
    """What the receiving side allocates for one weight: its HF name, dtype and shape."""

    name: str
    dtype: str  # "bfloat16", as vLLM's update info spells it
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * getattr(torch, self.dtype).itemsize


@dataclass(frozen=True)
class TransferEndpoint:
    """Where the group meets (rank 0's host:port), how big it is, and how weights travel."""

    host: str
    port: int
    world_size: int
    backend: TransferBackend
    bucket_bytes: int

    def worker_init_info(self, rank_offset: int) -> dict[str, Any]:
        """The payload of vLLM's `init_weight_transfer_engine` for the engine at `rank_offset`
        (the fields of vLLM's `NCCLWeightTransferInitInfo`, which the gloo engine shares)."""
        return {
            "master_address": self.host,
            "master_port": self.port,
            "rank_offset": rank_offset,
            "world_size": self.world_size,
            "packed": True,
            "packed_buffer_size_bytes": self.bucket_bytes,
            "packed_num_buffers": PACKED_BUFFERS,
        }


def update_info(manifest: list[TensorSpec]) -> dict[str, list]:
    """The payload of vLLM's `update_weights` (`NCCLWeightTransferUpdateInfo`'s fields)."""
    return {
        "names": [spec.name for spec in manifest],
        "dtype_names": [spec.dtype for spec in manifest],
        "shapes": [list(spec.shape) for spec in manifest],
    }


def manifest_from_update_info(info: dict[str, list]) -> list[TensorSpec]:
    """`update_info`'s inverse (the gloo worker's view of what is coming)."""
    return [
        TensorSpec(name, dtype, tuple(shape))
        for name, dtype, shape in zip(
            info["names"], info["dtype_names"], info["shapes"], strict=True
        )
    ]


def bucket_plan(manifest: list[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """The gloo buckets: consecutive manifest indices, each bucket closed once it holds at
    least `bucket_bytes` (so a tensor larger than a bucket travels alone)."""
    plan: list[list[int]] = [[]]
    size = 0
    for index, spec in enumerate(manifest):
        plan[-1].append(index)
        size += spec.nbytes
        if size >= bucket_bytes:
            plan.append([])
            size = 0
    return [bucket for bucket in plan if bucket]


class GlooGroup:
    """A gloo process group of its own (not torch.distributed's default group, which a sharded
    learner uses for FSDP2), formed over a TCPStore at rank 0's host:port."""

    def __init__(self, host: str, port: int, rank: int, world_size: int):
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=TRANSFER_TIMEOUT)
        self.group = dist.ProcessGroupGloo(store, rank, world_size, TRANSFER_TIMEOUT)
        self.store = store  # rank 0 serves it: it must outlive the group

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = src
        self.group.broadcast([tensor], options).wait()

    def destroy(self) -> None:
        self.group = None
        self.store = None


def receive_buckets(
    group: GlooGroup, manifest: list[TensorSpec], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """gloo, an engine worker: each bucket's (name, tensor) pairs as it arrives."""
    for bucket in bucket_plan(manifest, bucket_bytes):
        specs = [manifest[i] for i in bucket]
        flat = torch.empty(sum(spec.nbytes for spec in specs), dtype=torch.uint8)
        group.broadcast(flat)
        pieces = flat.split([spec.nbytes for spec in specs])
        yield [  # a copy each: a piece's offset in the bucket need not suit its dtype
            (spec.name, piece.clone().view(getattr(torch, spec.dtype)).view(spec.shape))
            for spec, piece in zip(specs, pieces, strict=True)
        ]


class WeightSender:
    """The learner's end of the group: rank 0 broadcasts, the engines' workers receive."""

    def __init__(self, endpoint: TransferEndpoint):
        self.endpoint = endpoint
        if endpoint.backend == "gloo":
            self.group: Any = GlooGroup(endpoint.host, endpoint.port, 0, endpoint.world_size)
        else:
            from vllm.distributed.weight_transfer.nccl_common import trainer_init

            self.group = trainer_init(
                {
                    "master_address": endpoint.host,
                    "master_port": endpoint.port,
                    "world_size": endpoint.world_size,
                }
            )

    def send(self, manifest: list[TensorSpec], weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Broadcast `weights` (in manifest order, each checked against it) to the engines."""
        checked = _checked(manifest, weights)
        if self.endpoint.backend == "nccl":
            from vllm.distributed.weight_transfer.packed_tensor import (
                packed_nccl_broadcast_producer,
            )

            packed_nccl_broadcast_producer(
                iterator=checked,
                group=self.group,
                src=0,
                post_iter_func=lambda item: item[1],
                buffer_size_bytes=self.endpoint.bucket_bytes,
                num_buffers=PACKED_BUFFERS,
            )
            torch.cuda.current_stream().synchronize()
            return
        for bucket in bucket_plan(manifest, self.endpoint.bucket_bytes):
            tensors = [next(checked)[1] for _ in bucket]
            self.group.broadcast(torch.cat([_as_bytes(tensor) for tensor in tensors]))
        for _ in checked:  # raises if there are more weights than the manifest holds
            pass

    def close(self) -> None:
        self.group.destroy()


def _checked(
    manifest: list[TensorSpec], weights: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights, each checked against the manifest the engines allocate from: a mismatch
    would split the stream differently on each side, so it is an error naming the weight."""
    sent = 0
    for name, tensor in weights:
        if sent >= len(manifest):
            raise ValueError(f"weight {name!r} is not in the manifest the engines were sent")
        spec = manifest[sent]
        got = TensorSpec(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
        if got != spec:
            raise ValueError(f"weight {sent} is {got}, but the engines expect {spec}")
        sent += 1
        yield name, tensor
    if sent != len(manifest):
        raise ValueError(f"sent {sent} weights, but the engines expect {len(manifest)}")


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(-1).view(torch.uint8)
