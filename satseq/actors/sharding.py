"""An agent sharded over W learner ranks (`trainer.workers_per_agent`, design §3): the ranks'
`torch.distributed` group (NCCL on GPUs, gloo on the CPU), FSDP2 over the model, and the few
collectives the learner's update needs on top of the ones FSDP2 makes itself.

The ranks are data parallel: each takes every W-th micro-batch of a batch, and every rank runs
the same number of forward and backward passes (FSDP2 all-gathers and reduce-scatters in every
one), so a rank with fewer micro-batches runs a stand-in of zero weight. FSDP2 averages the
gradients over the ranks, and each micro-batch's loss carries its share of the whole batch's
normaliser, so each rank scales its losses by W: W ranks compute the gradient of the same loss
as one.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from satseq.actors.forward import PolicyTrunk

T = TypeVar("T")
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)
"""How long a rank waits in a collective for the others (a dead rank ends the call sooner:
its sockets close)."""


@dataclass(frozen=True)
class ShardGroup:
    """This process's place in its agent's group of learner ranks."""

    rank: int
    world: int

    @property
    def sharded(self) -> bool:
        return self.world > 1

    def mine(self, items: list[T]) -> list[tuple[T, bool]]:
        """Every W-th item from this rank's index, as (item, real), padded with stand-ins
        (real=False, the first item) to the same count on every rank. Empty if items is."""
        if not items:
            return []
        count = -(-len(items) // self.world)
        own = items[self.rank :: self.world]
        return [(item, True) for item in own] + [(items[0], False)] * (count - len(own))

    def sum(self, value: float) -> float:
        """Σ over the ranks."""
        if not self.sharded:
            return value
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        total = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(total)
        return float(total)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's value, in rank order (picklable CPU objects)."""
        if not self.sharded:
            return [value]
        values: list[Any] = [None] * self.world
        dist.all_gather_object(values, value)
        return values


def free_address(host: str | None = None) -> str:
    """host:port where rank 0 can listen for the group's rendezvous: on `host` (127.0.0.1 for
    a group within one machine), else on every interface, named by this node's address."""
    with socket.socket() as probe:
        probe.bind((host or "", 0))
        port = probe.getsockname()[1]
    return f"{host or socket.gethostbyname(socket.gethostname())}:{port}"


def join_group(address: str, group: ShardGroup, device: torch.device) -> None:
    """(Re-)form the ranks' process group at rank 0's `address`; an old group of this process
    (its ranks restarted after a loss) is left first."""
    if dist.is_initialized():
        dist.destroy_process_group()
    if device.type == "cuda":
        torch.cuda.set_device(device.index or 0)  # NCCL's device for this rank
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://{address}",
        rank=group.rank,
        world_size=group.world,
        timeout=COLLECTIVE_TIMEOUT,
    )


def shard_policy(
    trunk: PolicyTrunk, world: int, device: torch.device, offload: bool, compute_dtype: torch.dtype
) -> PolicyTrunk:
    """FSDP2 over the trunk: each decoder layer a unit of its own, the root holding embeddings,
    final norm and output layer (tied or not). Master shards stay float32 and gradients are
    reduced in float32; offload keeps parameters, gradients and AdamW state on the host (CPU
    offload).

    A decoder layer is gathered in the compute dtype: each rank casts its own shard once a
    gather and half the bytes cross the wire, where a float32 gather left autocast to cast the
    whole layer again in every micro-batch. Its inputs are not cast, so the residual stream
    stays float32 as an unsharded agent's does under autocast. The root is gathered in float32:
    the output layer's float32 logits (`fp32_head`) need its float32 weights."""
    mesh = init_device_mesh(device.type, (world,))
    offloading = {"offload_policy": CPUOffloadPolicy()} if offload else {}

    def options(gathered_dtype: torch.dtype | None) -> dict[str, Any]:
        precision = MixedPrecisionPolicy(
            param_dtype=gathered_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False
        )
        return {"mesh": mesh, "mp_policy": precision, **offloading}

    layer_dtype = None if compute_dtype == torch.float32 else compute_dtype
    for layer in trunk.model.base_model.layers:
        fully_shard(layer, **options(layer_dtype))
    fully_shard(trunk, **options(None))
    return trunk


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor, gathered from the ranks' shards (a collective: every rank calls it, in
    the same order); a plain tensor as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_state(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) for the model's state dict, one tensor gathered at a time."""
    for name, tensor in model.state_dict().items():
        yield name, full(tensor.detach())


def clip_grad_norm_(parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` over all ranks' shards: the norm of the whole gradient
    (a 0-dim tensor on the gradients' device, not read back)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = full(torch.nn.utils.get_total_norm(grads))
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm
