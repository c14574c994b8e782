"""Building a rollout engine by name (`rollout.engine`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from satseq.actors.engines.base import ENGINE_KINDS, Engine, EngineKind


def make_engine(
    kind: EngineKind,
    model_path: str | Path,
    *,
    dtype: str = "float32",
    seed: int = 0,
    **engine_options: Any,
) -> Engine:
    """The `kind` engine on the model at `model_path` (a directory or any name that
    `satseq.models.resolve_model_path` accepts).

    `seed` fixes the engine's sampling stream: the same seed and the same calls give the same
    samples. `engine_options` go to the engine's constructor (see `HFEngine` and `VLLMEngine`).
    vLLM is imported only when asked for: importing it takes tens of seconds.
    """
    if kind == "hf":
        from satseq.actors.engines.hf import HFEngine

        return HFEngine(model_path, dtype=dtype, seed=seed, **engine_options)
    if kind == "vllm":
        from satseq.actors.engines.vllm import VLLMEngine

        return VLLMEngine(model_path, dtype=dtype, seed=seed, **engine_options)
    raise ValueError(f"unknown rollout engine {kind!r}; use one of {list(ENGINE_KINDS)}")
