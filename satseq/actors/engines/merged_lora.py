"""A LoRA agent on an engine of its own with its adapter merged into the base's weights
(`rollout.lora_engines: merged`, design §12).

Where an engine's multi-LoRA path is slow (vLLM's CPU build generates with adapters several
times slower than without: docs/benchmarks.md), each LoRA agent may instead sample from a full
model, its base with W + s·B·A at every adapted layer (s = α/r, or α/√r with rsLoRA). A push
still moves the adapter's tensors only; the engine's side merges them into the base's weights
it keeps (one copy per base, shared by its agents) and loads the merged model as a full agent's
engine loads a full model's weights. The log-probs are the adapter's, up to float rounding.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from satseq.actors.engines.base import Engine, EngineKind
from satseq.actors.engines.factory import make_engine
from satseq.actors.trajectory import Generation, SamplingSpec
from satseq.models.adapters import adapter_base, adapter_config, merged_adapter

PEFT_PREFIX = "base_model.model."
"""What PEFT puts before a module's name in an adapter's tensor names."""
LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"
UNMERGEABLE = {  # adapter config keys whose non-default values this merge does not compute
    "use_dora": False,
    "fan_in_fan_out": False,
    "bias": "none",
    "lora_bias": False,
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "layer_replication": None,
    "trainable_token_indices": None,
}


def merge_scale(config: dict[str, Any], adapter_dir: str | Path) -> float:
    """s of W + s·B·A for the adapter's config: α/r, α/√r with rsLoRA; an adapter this merge
    cannot compute is refused, naming the config key."""
    for key, default in UNMERGEABLE.items():
        if config.get(key, default) not in (None, default, [], {}):
            raise ValueError(
                f"{adapter_dir}: adapter_config.json sets {key}={config[key]!r}, which a merged "
                "LoRA engine does not compute: use rollout.lora_engines: shared"
            )
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    return alpha / (math.sqrt(r) if config.get("use_rslora") else r)


@functools.cache
def base_weights(base_dir: str) -> dict[str, torch.Tensor]:
    """The base model's weights in float32, named as in its safetensors files (what a full
    model's push names them), read once a process and shared by the agents on it."""
    files = sorted(Path(base_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{base_dir}: no *.safetensors weights to merge adapters into")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights |= {name: t.float() for name, t in load_file(str(file)).items()}
    return weights


def merged_weights(
    base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], scale: float
) -> dict[str, torch.Tensor]:
    """The base's weights with the adapter merged in: W + scale·B·A at each module the adapter
    (PEFT-named tensors) adapts, every other weight as the base has it."""
    merged = dict(base)
    for name, lora_a in adapter.items():
        if not name.endswith(LORA_A):
            continue
        module = name.removeprefix(PEFT_PREFIX).removesuffix(LORA_A)
        lora_b = adapter[name.removesuffix(LORA_A) + LORA_B]
        weight = f"{module}.weight"
        if weight not in base:
            raise KeyError(f"the adapter adapts {module}, which the base model does not have")
        merged[weight] = torch.addmm(base[weight], lora_b.float(), lora_a.float(), alpha=scale)
    return merged


class MergedLoraEngine:
    """One LoRA agent's `Engine`: a `kind` engine of its own on its base with its adapter
    merged in (`merged_adapter`, cached in the model cache), which takes pushes of the
    adapter's tensors."""

    def __init__(self, kind: EngineKind, adapter_dir: str, seed: int, options: dict[str, Any]):
        self.scale = merge_scale(adapter_config(adapter_dir), adapter_dir)
        self.base = base_weights(str(adapter_base(adapter_dir)))
        self.engine: Engine = make_engine(kind, merged_adapter(adapter_dir), seed=seed, **options)

    def generate(
        self, prompts: list[list[int]], spec: SamplingSpec, n: int = 1
    ) -> list[list[Generation]]:
        return self.engine.generate(prompts, spec, n)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """The agent's adapter tensors (PEFT-named, as its learner sends them)."""
        self.engine.load_weights(merged_weights(self.base, weights, self.scale))

    def prompt_logprobs(
        self, sequences: list[list[int]], start: list[int], temperature: float = 1.0
    ) -> list[list[float]]:
        return self.engine.prompt_logprobs(sequences, start, temperature)

    def sleep(self) -> str:
        return self.engine.sleep()

    def wake_up(self) -> str:
        return self.engine.wake_up()

    def close(self) -> None:
        self.engine.close()
