"""The backtracking snapshot: weights and optimiser state kept off the accelerator, so that a
trust-region attempt that overshoots can be undone (design §4, §11)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.distributed.tensor import DTensor


class TrainingSnapshot:
    """Weights and optimiser state kept off the accelerator, in CPU buffers reused across steps
    (pinned where the source is on a GPU, so the copies run asynchronously on its stream).

    `save` copies the trained parameters (a LoRA agent's adapter, not its frozen base) and each
    one's optimiser state into the buffers (one per tensor, allocated on first use); `restore`
    copies them back in place. A sharded parameter (a DTensor, FSDP2) and its state are saved
    and restored as this rank's shard. Stream order makes the asynchronous device-to-host copies
    finish before the optimiser step that follows overwrites the source; the host waits only in
    `restore`.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self.model: dict[str, torch.Tensor] = {}
        self.optimizer: dict[str, Any] = {}

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainingSnapshot:
        self.model = {
            name: self._copy_out(f"model/{name}", param)
            for name, param in trained_parameters(model)
        }
        self.optimizer = {
            "state": {
                index: {
                    key: self._copy_out(f"optimizer/{index}/{key}", value)
                    if isinstance(value, torch.Tensor)
                    else copy.deepcopy(value)
                    for key, value in optimizer.state[param].items()
                }
                for index, param in enumerate(_parameters(optimizer))
                if param in optimizer.state
            },
            "param_groups": [
                {key: copy.deepcopy(value) for key, value in group.items() if key != "params"}
                for group in optimizer.param_groups
            ],
        }
        return self

    @torch.no_grad()
    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if any(buffer.is_pinned() for buffer in self._buffers.values()):
            torch.cuda.synchronize()  # the host reads the pinned buffers below
        for name, param in trained_parameters(model):
            local_shard(param).copy_(self.model[name], non_blocking=True)
        saved_state = self.optimizer["state"]
        for index, param in enumerate(_parameters(optimizer)):
            if index not in saved_state:  # no step had been taken: AdamW starts afresh
                optimizer.state.pop(param, None)
                continue
            state = optimizer.state[param]
            for key, value in saved_state[index].items():
                if isinstance(value, torch.Tensor):
                    local_shard(state[key]).copy_(value, non_blocking=True)
                else:
                    state[key] = copy.deepcopy(value)
        saved_groups = self.optimizer["param_groups"]
        for group, saved in zip(optimizer.param_groups, saved_groups, strict=True):
            group.update(copy.deepcopy(saved))

    @property
    def nbytes(self) -> int:
        return sum(buffer.nbytes for buffer in self._buffers.values())

    def _copy_out(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        tensor = local_shard(tensor.detach())
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(
                tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=tensor.is_cuda
            )
            self._buffers[key] = buffer
        return buffer.copy_(tensor, non_blocking=buffer.is_pinned())


def trained_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of the weights that train: all of a full model's, a LoRA adapter's."""
    return [(name, param) for name, param in model.named_parameters() if param.requires_grad]


def _parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [param for group in optimizer.param_groups for param in group["params"]]


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded (DTensor) tensor; a plain tensor as it is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
