"""vLLM's multi-LoRA for the LoRA agents on one base (DESIGN §12): one `vllm.LLM` on the base,
one `LoRARequest` per agent, so the agents share one copy of the base and one KV cache.

A push installs the agent's adapter as a new version: its tensors are written into a fresh
adapter directory (in /dev/shm where there is one) and loaded under a new `lora_int_id`, after
the old version is removed from the engine. vLLM caches adapters and prefix-cache blocks by id,
so a new id is what guarantees that no request after the push reads the old adapter, and that
the other agents' cached blocks stay.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from vllm.lora.request import LoRARequest

from satseq.models.adapters import ADAPTER_WEIGHTS, adapter_config, write_adapter

MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM's kernels are built for (`max_lora_rank`'s choices)."""
SHARED_MEMORY = Path("/dev/shm")


def lora_options(adapter_dirs: list[str]) -> dict[str, Any]:
    """The `vllm.LLM` options for `adapter_dirs`: a slot for each, and the smallest rank bound
    vLLM has that holds the largest."""
    rank = max(int(adapter_config(d)["r"]) for d in adapter_dirs)
    bound = next((r for r in MAX_LORA_RANKS if r >= rank), None)
    if bound is None:
        raise ValueError(f"vLLM serves LoRA ranks up to {MAX_LORA_RANKS[-1]}, not {rank}")
    return {"enable_lora": True, "max_loras": len(adapter_dirs), "max_lora_rank": bound}


@dataclass
class InstalledAdapter:
    """An agent's adapter as the engine holds it now: its request, config and tensors."""

    request: LoRARequest
    config: dict
    tensors: dict[str, torch.Tensor]


class VLLMAdapters:
    """The adapters of one `vllm.LLM` started with `lora_options`, by agent name."""

    def __init__(self, llm: Any, max_loras: int, max_rank: int):
        self.llm = llm
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.installed: dict[str, InstalledAdapter] = {}
        self.ids = itertools.count(1)
        root = SHARED_MEMORY if SHARED_MEMORY.is_dir() else None
        self.root = Path(tempfile.mkdtemp(prefix="satseq-adapters-", dir=root))

    def can_add(self, adapter_dir: str) -> bool:
        """A free slot and a rank within the engine's bound."""
        rank = int(adapter_config(adapter_dir)["r"])
        return len(self.installed) < self.max_loras and rank <= self.max_rank

    def add(self, name: str, adapter_dir: str) -> None:
        if not self.can_add(adapter_dir):
            raise ValueError(
                f"this vLLM engine holds {self.max_loras} adapters of rank ≤ {self.max_rank}: "
                f"no room for {adapter_dir}"
            )
        tensors = load_file(Path(adapter_dir) / ADAPTER_WEIGHTS)
        self._install(name, adapter_config(adapter_dir), tensors)

    def load(self, name: str, weights: dict[str, torch.Tensor]) -> None:
        """A push: agent `name`'s tensors (all or some) as its adapter's next version."""
        current = self.installed[name]
        unknown = sorted(set(weights) - set(current.tensors))
        if unknown:
            raise ValueError(f"adapter {name!r} has no weights named {unknown[:5]}")
        self._install(name, current.config, current.tensors | weights)

    def remove(self, name: str) -> None:
        old = self.installed.pop(name)
        self.llm.llm_engine.remove_lora(old.request.lora_int_id)
        shutil.rmtree(old.request.lora_path, ignore_errors=True)

    def request(self, name: str | None) -> LoRARequest | None:
        """What a prompt of agent `name` is generated with (None: the base)."""
        return None if name is None else self.installed[name].request

    def _install(self, name: str, config: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Write and load a new version of `name`'s adapter; the old one goes first, so its
        slot is free and no request can find it."""
        version = next(self.ids)
        directory = write_adapter(self.root / f"{name}-v{version}", config, tensors)
        if name in self.installed:
            self.remove(name)
        request = LoRARequest(f"{name}-v{version}", version, str(directory))
        self.llm.llm_engine.add_lora(request)  # loaded now: a failure is the push's
        self.installed[name] = InstalledAdapter(request, config, tensors)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
