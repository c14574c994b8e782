"""LoRA adapters (design §12): a LoRA agent is a PEFT adapter on a frozen base model.

An adapter directory is PEFT's format (`adapter_config.json`, `adapter_model.safetensors`),
which `peft.PeftModel.from_pretrained` and vLLM's `LoRARequest` load. satseq writes the base's
tokenizer beside them, so that an adapter directory stands for its agent wherever a model
directory does (`load_tokenizer`, chat template); its base is the local directory named by
`base_model_name_or_path`.

A fresh LoRA agent starts from `initial_adapter`: peft's initialisation (B = 0, so the adapter
computes the base exactly; A drawn from the agent's seed), written once into the model cache,
so that its learner and its rollout engines load the same directory.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel

from satseq.models.cache import cached_build, default_cache_dir
from satseq.models.loading import ADAPTER_CONFIG, is_adapter_dir, load_policy

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ALL_LINEAR = "all-linear"
ADAPTER_NAME = "default"
"""The name peft gives the one adapter of a peft model (a learner's)."""
INITIAL_ADAPTER_VERSION = 1
"""Bump when `initial_adapter` writes something else, so cached ones are made anew."""


@dataclass(frozen=True)
class LoraSpec:
    """A fresh adapter: rank r, scale alpha/r, dropout on its input, and the linear layers it
    adapts (`all-linear`: every linear layer but the output layer)."""

    rank: int
    alpha: float
    dropout: float = 0.0
    target_modules: tuple[str, ...] | str = ALL_LINEAR


def adapter_config(adapter_dir: str | Path) -> dict:
    """The adapter's `adapter_config.json`."""
    return json.loads((Path(adapter_dir).expanduser() / ADAPTER_CONFIG).read_text())


def adapter_base(adapter_dir: str | Path) -> Path:
    """The base model directory the adapter was made on."""
    return Path(adapter_config(adapter_dir)["base_model_name_or_path"])


def model_config_dir(path: str | Path) -> Path:
    """Where a model's `config.json` is: its own directory, or an adapter's base."""
    return adapter_base(path) if is_adapter_dir(path) else Path(path)


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The short names of the model's linear layers ("q_proj", ...), its output layer aside:
    what `all-linear` adapts."""
    head = model.get_output_embeddings()
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head
        }
    )


def target_module_names(model: torch.nn.Module, targets: tuple[str, ...] | str) -> list[str]:
    """The linear layers `targets` names, checked against the model's (ValueError naming the
    ones it lacks); `all-linear` as the list of short names, which vLLM reads as peft does."""
    linear = linear_module_names(model)
    if targets == ALL_LINEAR:
        return linear
    unknown = sorted(set(targets) - set(linear))
    if unknown:
        raise ValueError(
            f"the model has no linear layers named {unknown}; its linear layers are {linear} "
            f"(or '{ALL_LINEAR}')"
        )
    return sorted(set(targets))


def lora_config(model: torch.nn.Module, spec: LoraSpec):
    """peft's `LoraConfig` of `spec` on `model`."""
    from peft import LoraConfig

    if spec.rank <= 0:
        raise ValueError(f"a LoRA rank must be positive, got {spec.rank}")
    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=target_module_names(model, spec.target_modules),
    )


def initial_adapter(
    base_dir: str | Path,
    spec: LoraSpec,
    seed: int,
    cache_dir: str | Path | None = None,
) -> Path:
    """The directory of a fresh adapter of `spec` on the base at `base_dir` (A drawn with
    `seed`, B = 0), made once in the model cache."""
    base_dir = Path(base_dir).resolve()
    identity = json.dumps([str(base_dir), asdict(spec), seed, INITIAL_ADAPTER_VERSION])
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    directory = Path(cache_dir or default_cache_dir()) / "adapters" / f"{base_dir.name}-{key}"

    def build(out_dir: Path) -> None:
        from peft import get_peft_model

        model, tokenizer = load_policy(base_dir, "float32")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            adapted = get_peft_model(model, lora_config(model, spec))
        adapted.peft_config["default"].base_model_name_or_path = str(base_dir)
        adapted.save_pretrained(str(out_dir))
        tokenizer.save_pretrained(str(out_dir))

    return cached_build(directory, build)


def load_adapted_policy(
    adapter_dir: str | Path, dtype: str, device: str = "cpu", trainable: bool = False
):
    """(peft model, tokenizer): the base in `dtype` with the adapter (float32 where the base is
    not: peft's `autocast_adapter_dtype`) under the name "default"; trainable: the adapter's
    parameters require gradients, the base's never do."""
    from peft import PeftModel

    model, tokenizer = load_policy(adapter_base(adapter_dir), dtype, device)
    model.requires_grad_(False)
    adapted = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=trainable)
    return adapted, tokenizer


def write_adapter(
    directory: str | Path, config: dict, tensors: dict[str, torch.Tensor] | None
) -> Path:
    """An adapter directory from its config and its PEFT-named tensors (what vLLM loads); its
    config alone where `tensors` is None."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ADAPTER_CONFIG).write_text(json.dumps(config))
    if tensors is not None:
        weights = {name: t.contiguous() for name, t in tensors.items()}
        save_file(weights, directory / ADAPTER_WEIGHTS)
    return directory


def merge_adapter(adapter_dir: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """A full HF model directory: the base with the adapter merged into its weights
    (`merge_and_unload`), and the tokenizer."""
    adapted, tokenizer = load_adapted_policy(adapter_dir, dtype)
    merged: PreTrainedModel = adapted.merge_and_unload()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return Path(out_dir)


def merged_adapter(adapter_dir: str | Path, cache_dir: str | Path | None = None) -> Path:
    """`merge_adapter` of `adapter_dir` (float32), made once in the model cache and keyed by the
    adapter's files, so a retrained adapter in the same place is merged anew."""
    adapter_dir = Path(adapter_dir)
    digest = hashlib.sha256()
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        digest.update((adapter_dir / name).read_bytes())
    key = digest.hexdigest()[:16]
    directory = Path(cache_dir or default_cache_dir()) / "merged" / f"{adapter_dir.name}-{key}"
    return cached_build(directory, lambda out_dir: merge_adapter(adapter_dir, out_dir))
