"""Where a learner keeps its training state between updates (`trainer.offload`), and the peak
device memory of a phase.

SAT-Seq updates one agent at a time, so on a shared accelerator most learners sit idle most of
the stage. With `offload: idle_agents` an idle learner holds nothing on its device: its float32
master weights and AdamW moments wait in host memory (pinned on a GPU). An update brings both
back and sends them away afterwards. A forward pass while idle (behaviour log-probs, value
estimates, a swap's π_cur) needs neither moments nor masters: for its duration the device gets
compute-dtype copies of the weights that autocast casts at every use (those only `nn.Linear`
layers read) and float32 copies of the rest (embeddings, norms), so it computes exactly what it
computes over the masters, and the copies are freed when it returns.

On the CPU a move is `.to("cpu")` of a CPU tensor, which returns the tensor itself: nothing is
copied (a float32 forward pass reads the masters), but the same code runs and `ResidencyStats`
counts it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

GIB = 2**30


@dataclass
class ResidencyStats:
    """The moves so far: how many each way, the bytes they moved (float32 masters and AdamW
    state), and the seconds they took, copies finished."""

    offloads: int = 0
    onloads: int = 0
    bytes_offloaded: int = 0
    bytes_onloaded: int = 0
    seconds: float = 0.0
    forward_copies: int = 0  # forward passes that took the weights to the device for their span


def autocast_parameters(model: torch.nn.Module) -> set[torch.nn.Parameter]:
    """The parameters that only `nn.Linear` layers use. Autocast casts them to the compute dtype
    at every use, so a compute-dtype copy gives the same results; a parameter that another
    module uses too (tied embeddings) is not one of them."""
    linear: set[torch.nn.Parameter] = set()
    other: set[torch.nn.Parameter] = set()
    for module in model.modules():
        users = linear if isinstance(module, torch.nn.Linear) else other
        users.update(module.parameters(recurse=False))
    return linear - other


class Residency:
    """Moves a learner's float32 master weights and AdamW state between its device and host
    memory. `offload()` does nothing unless `enabled`, and neither it nor `ensure_resident()`
    does anything when the state is already where it would put it. Only trained weights move:
    a LoRA agent's frozen base stays on the device (it has no masters nor AdamW state)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        compute_dtype: torch.dtype,
        enabled: bool,
    ):
        self.optimizer = optimizer
        self.enabled = enabled
        self.device = next(model.parameters()).device
        self.parameters = [param for param in model.parameters() if param.requires_grad]
        cast = autocast_parameters(model)
        self.copy_dtype = {  # each parameter's copy on the device while offloaded
            param: compute_dtype if param in cast else param.dtype for param in self.parameters
        }
        self.resident = True
        self.stats = ResidencyStats()
        self._offloaded_state: list[tuple[dict[str, Any], str]] = []  # (AdamW state, key)
        self._pinned: dict[torch.nn.Parameter, dict[str, torch.Tensor]] = {}  # GPU: host buffers

    def offload(self) -> None:
        """Masters and AdamW state to host memory; the device keeps nothing of this learner.
        Gradients are dropped: every optimiser step zeroes them first."""
        if not self.enabled or not self.resident:
            return
        started, moved = time.perf_counter(), 0
        self._offloaded_state = []
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device == param.device:
                    state[key] = self._to_host(param, key, value)
                    self._offloaded_state.append((state, key))
                    moved += value.nbytes
        for param in self.parameters:
            param.grad = None
            param.data = self._to_host(param, "master", param.data)
            moved += param.data.nbytes
        self._finish(started)
        self.resident = False
        self.stats.offloads += 1
        self.stats.bytes_offloaded += moved

    def ensure_resident(self) -> None:
        """Masters and AdamW state back on the device (before anything that steps or loads)."""
        if self.resident:
            return
        started, moved = time.perf_counter(), 0
        for param in self.parameters:
            moved += param.data.nbytes
            param.data = param.data.to(self.device, non_blocking=True)
        for state, key in self._offloaded_state:
            moved += state[key].nbytes
            state[key] = state[key].to(self.device, non_blocking=True)
        self._offloaded_state = []
        self._finish(started)
        self.resident = True
        self.stats.onloads += 1
        self.stats.bytes_onloaded += moved

    @contextmanager
    def forward_weights(self) -> Iterator[None]:
        """For a forward pass: an idle learner's weights on the device, in the dtypes the pass
        reads them in, freed afterwards (the masters stay in host memory)."""
        if self.resident:
            yield
            return
        masters = {param: param.data for param in self.parameters}
        for param, master in masters.items():
            param.data = master.to(self.device, self.copy_dtype[param], non_blocking=True)
        self.stats.forward_copies += 1
        try:
            yield
        finally:
            for param, master in masters.items():
                param.data = master

    def _to_host(self, param: torch.nn.Parameter, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` in host memory: itself when it is there already, else a copy in a pinned
        buffer that the next offload reuses."""
        if not tensor.is_cuda:
            return tensor.to("cpu")
        buffers = self._pinned.setdefault(param, {})
        if key not in buffers:
            buffers[key] = torch.empty(
                tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True
            )
        buffer = buffers[key]
        return buffer.copy_(tensor, non_blocking=True)

    def _finish(self, started: float) -> None:
        """Wait for the asynchronous copies (the host reads the buffers; the seconds are real)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.stats.seconds += time.perf_counter() - started


def return_free_host_memory() -> None:
    """Give the C allocator's free memory back to the system (glibc's `malloc_trim`). An
    update's transient tensors are freed into glibc's heaps, which keep them: without this an
    idle learner holds its last update's peak (about 1.3 GB for a SmolLM2 LoRA micro-batch of 4)
    until its next, and a team holds one peak per learner. A no-op without glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    library = ctypes.util.find_library("c")
    libc = ctypes.CDLL(library) if library else None
    return getattr(libc, "malloc_trim", None)


def reset_peak_memory(device: torch.device) -> None:
    """Start a phase's peak (see `peak_memory_gib`)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    """The most device memory allocated since `reset_peak_memory`, in GiB; None off CUDA. The
    CPU's only peak, the process's ru_maxrss, cannot be reset per phase and, in-process, is
    shared by every learner, so it is not reported."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / GIB
