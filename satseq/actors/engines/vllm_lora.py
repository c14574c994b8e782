"""vLLM's multi-LoRA for the LoRA agents on one base (design §12): one `vllm.LLM` on the base,
one `LoRARequest` per agent, so the agents share one copy of the base and one KV cache.

A push installs the agent's adapter as a new version under a new `lora_int_id`, after the old
version is removed from the engine. vLLM caches adapters and prefix-cache blocks by id, so a new
id is what guarantees that no request after the push reads the old adapter, and that the other
agents' cached blocks stay.

vLLM loads an adapter from a directory. A push hands it the tensors in memory instead: the
version's directory holds its `adapter_config.json` only, and the engine's worker builds the
adapter from the pushed tensors (`InMemoryLoRAModel`, installed as the worker's adapter class:
the engine runs in this process). Writing and reading 420 tensors' safetensors file was 0.05 s
of a 0.085 s SmolLM2 rank-16 install. Where a vLLM release has no such hook the push writes the
whole directory (in /dev/shm where there is one), which any vLLM loads.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import load_file
from vllm.lora.lora_model import LoRAModel
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


class InMemoryLoRAModel(LoRAModel):
    """vLLM's adapter model, built from the tensors registered in `tensors` under its directory
    (`registered`) while a push installs it, else from the directory's files. vLLM loads an
    adapter once, when it is added: with no more adapters than slots (`VLLMAdapters.can_add`)
    its cache never evicts one, so no later load needs them."""

    tensors: ClassVar[dict[str, dict[str, torch.Tensor]]] = {}

    @classmethod
    def from_local_checkpoint(cls, lora_dir, expected_lora_modules, peft_helper, **options):
        tensors = cls.tensors.get(registered(lora_dir))
        if tensors is None:
            return super().from_local_checkpoint(
                lora_dir, expected_lora_modules, peft_helper, **options
            )
        # vLLM scales B in place (`optimize`): it gets copies. The names are those of the
        # agent's first version, which vLLM checked against the model (`VLLMAdapters.load`).
        dtype = options.get("dtype")
        return cls.from_lora_tensors(
            lora_model_id=options["lora_model_id"],
            tensors={name: t.to(dtype, copy=True) for name, t in tensors.items()},
            peft_helper=peft_helper,
            device=options.get("device", "cpu"),
            dtype=dtype,
            model_vocab_size=options.get("model_vocab_size"),
            weights_mapper=options.get("weights_mapper"),
            skip_prefixes=options.get("skip_prefixes"),
        )


def registered(directory: str | Path) -> str:
    """The key of an adapter directory's tensors in `InMemoryLoRAModel.tensors`."""
    return os.path.realpath(directory)


def use_in_memory_adapters(worker: Any) -> bool:
    """Run by vLLM on its worker (`collective_rpc`): its adapters are `InMemoryLoRAModel`s;
    False where this vLLM's worker has no adapter class to replace."""
    manager = getattr(getattr(worker, "model_runner", None), "lora_manager", None)
    if getattr(manager, "_lora_model_cls", None) is not LoRAModel:
        return False
    manager._lora_model_cls = InMemoryLoRAModel
    return True


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
        self.in_memory = all(llm.collective_rpc(use_in_memory_adapters))
        """Pushes hand the engine their tensors (else: write them to the version's directory)."""

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
        directory = self.root / f"{name}-v{version}"
        in_memory = self.in_memory and name in self.installed  # a first version: from files
        write_adapter(directory, config, None if in_memory else tensors)
        if name in self.installed:
            self.remove(name)
        request = LoRARequest(f"{name}-v{version}", version, str(directory))
        if in_memory:
            InMemoryLoRAModel.tensors[registered(directory)] = tensors
        try:
            self.llm.llm_engine.add_lora(request)  # loaded now: a failure is the push's
        finally:
            InMemoryLoRAModel.tensors.pop(registered(directory), None)
        self.installed[name] = InstalledAdapter(request, config, tensors)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
