"""The one place policies are loaded: a local directory, a `builtin:` name, a `gguf:` file, or
a Hub name.

`resolve_model_path` turns any of them into a local directory (what vLLM engines need too), and
`load_policy` loads the model and tokenizer from it. Hub names are looked up in the Hugging Face
cache first, so a model downloaded once loads with no network. Otherwise they are fetched, after
a short-timeout probe of the Hub, so that a machine without network fails in seconds with a
`ModelLoadError` saying what to do, instead of hanging on connection attempts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from huggingface_hub import HfApi, constants, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
)
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from satseq.model_trust import trusts
from satseq.models.cache import (
    BUILTIN_MODELS,
    BUILTIN_PREFIX,
    UnknownBuiltinModelError,
    resolve_builtin,
)
from satseq.models.gguf import (
    BUILTIN_GGUF_MODELS,
    GGUF_PREFIX,
    GGUFImportError,
    builtin_gguf_file,
    resolve_gguf,
)

DType = Literal["auto", "float32", "bfloat16", "float16"]
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
HUB_PROBE_TIMEOUT_S = 10.0
# What a causal LM needs from a Hub repo: configs, tokenizer files, safetensors weights (repos
# that also ship .bin/.pt copies of the weights would otherwise be downloaded twice).
HUB_FILE_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
ADAPTER_CONFIG = "adapter_config.json"
"""What makes a directory a PEFT adapter (`satseq.models.adapters`) rather than a model."""


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message says which, why, and what to do."""


def load_tokenizer(path_or_name: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a local dir, builtin or Hub name (as saved: no padding changes)."""
    path = resolve_model_path(path_or_name)
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trusts(path))
    except (OSError, ValueError) as error:
        raise ModelLoadError(
            f"could not load the tokenizer of {str(path_or_name)!r} from {path}: {error}"
        ) from error


def load_policy(
    path_or_name: str | Path, dtype: DType = "auto", device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (in eval mode, on `device`) and tokenizer of a local dir, builtin or Hub name.

    `dtype="auto"` keeps the checkpoint's dtype. The tokenizer pads on the left, for batched
    generation, and falls back to eos as its pad token if it has none.
    """
    if dtype != "auto" and dtype not in TORCH_DTYPES:
        raise ModelLoadError(
            f"unknown dtype {dtype!r}; use 'auto' or one of {sorted(TORCH_DTYPES)}"
        )
    tokenizer = load_tokenizer(path_or_name)
    path = resolve_model_path(path_or_name)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=TORCH_DTYPES.get(dtype, "auto"), trust_remote_code=trusts(path)
        )
    except (OSError, ValueError) as error:
        raise ModelLoadError(
            f"could not load model {str(path_or_name)!r} from {path}: {error}"
        ) from error
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # .to(device) rather than device_map: device_map needs `accelerate`, a whole-model move
    # does not.
    return model.to(device).eval(), tokenizer


def is_adapter_dir(path: str | Path) -> bool:
    """A PEFT adapter directory (a LoRA agent: `satseq.models.adapters`)."""
    return (Path(path).expanduser() / ADAPTER_CONFIG).is_file()


def resolve_model_path(path_or_name: str | Path, revision: str | None = None) -> Path:
    """The local directory holding `path_or_name`'s model, building, importing or downloading
    it if needed: `gguf:FILE` and GGUF builtins are imported once into the model cache. A LoRA
    adapter directory is returned as it is (`satseq.models.adapters`). `revision`: a Hub
    model's branch, tag or commit (the snapshot of that revision); a Hub name only."""
    name = str(path_or_name)
    if revision is not None and (
        name.startswith((BUILTIN_PREFIX, GGUF_PREFIX)) or Path(name).expanduser().exists()
    ):
        raise ModelLoadError(
            f"model {name!r} is local or builtin: a revision ({revision!r}) names a version of a "
            "Hugging Face Hub model; drop it"
        )
    try:
        if name in BUILTIN_GGUF_MODELS:
            return resolve_gguf(builtin_gguf_file(name))
        if name.startswith(GGUF_PREFIX):
            return resolve_gguf(name.removeprefix(GGUF_PREFIX))
    except GGUFImportError as error:
        raise ModelLoadError(f"model {name!r}: {error}") from None
    if name.startswith(BUILTIN_PREFIX):
        try:
            return resolve_builtin(name)
        except UnknownBuiltinModelError:
            builtin_names = sorted([*BUILTIN_MODELS, *BUILTIN_GGUF_MODELS])
            raise ModelLoadError(
                f"unknown builtin model {name!r}; use one of {builtin_names}"
            ) from None
    local = Path(name).expanduser()
    if local.is_dir():
        if is_adapter_dir(local):
            return local
        if not (local / "config.json").is_file():
            raise ModelLoadError(
                f"{name!r} is a directory but not a model: it has no config.json (expected a "
                "Hugging Face `save_pretrained` directory, or a PEFT adapter directory with "
                f"{ADAPTER_CONFIG})"
            )
        return local
    if local.is_file() and local.suffix == ".gguf":
        raise ModelLoadError(f"{name!r} is a GGUF file; pass it as 'gguf:{name}' to import it")
    if local.exists() or _looks_like_a_path(name):
        raise ModelLoadError(
            f"model path {name!r} is not a directory; pass a Hugging Face model directory, "
            f"a Hub name such as 'Qwen/Qwen3-4B', or one of the builtin names"
        )
    return _hub_snapshot(name, revision)


def _hub_snapshot(name: str, revision: str | None = None) -> Path:
    """The local snapshot of Hub model `name` (at `revision`): from the HF cache, else
    downloaded."""
    try:
        cached = snapshot_download(
            name, revision=revision, allow_patterns=HUB_FILE_PATTERNS, local_files_only=True
        )
        return Path(cached)
    except HFValidationError:
        raise ModelLoadError(
            f"model {name!r} is not a local directory and not a valid Hugging Face Hub name "
            "('organisation/model'); check the path"
        ) from None
    except LocalEntryNotFoundError:
        pass  # not cached: fetch it below
    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(_not_fetched_message(name, "HF_HUB_OFFLINE is set")) from None
    try:
        # Probe with a short timeout first: downloads run without one, so with no network they
        # could wait on the operating system's connect timeout for minutes.
        HfApi().model_info(name, revision=revision, timeout=HUB_PROBE_TIMEOUT_S)
        return Path(snapshot_download(name, revision=revision, allow_patterns=HUB_FILE_PATTERNS))
    except (RepositoryNotFoundError, GatedRepoError) as error:
        reason = f"the Hub has no model {name!r} that we may read ({type(error).__name__})"
        raise ModelLoadError(_not_fetched_message(name, reason)) from None
    except Exception as error:  # network failures surface under many httpx/OS exception types
        reason = f"{type(error).__name__}: {_first_line(error)}"
        raise ModelLoadError(_not_fetched_message(name, reason)) from None


def _not_fetched_message(name: str, reason: str) -> str:
    return (
        f"model {name!r} is not a local directory, is not in the Hugging Face cache "
        f"({constants.HF_HUB_CACHE}), and could not be fetched from the Hub: {reason}. "
        f"To use it here, download it on a connected machine (`hf download {name} "
        "--local-dir DIR`) and pass DIR as the model path, or copy that machine's Hugging Face "
        "cache here and point HF_HOME at it (with HF_HUB_OFFLINE=1 to skip the network)."
    )


def _looks_like_a_path(name: str) -> bool:
    """A name a user meant as a filesystem path rather than 'organisation/model'."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no details"


def checkpoint_layers(model: PreTrainedModel, every: int) -> None:
    """Gradient checkpointing of every `every`-th decoder layer (0, every, 2·every, ...): those
    keep only their input for the backward and run again in it; the others keep their
    activations."""
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if every == 1:
        return  # every layer, as enabled (no per-layer flags needed)
    from transformers.modeling_layers import GradientCheckpointingLayer  # transformers 5's layers

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for index, layer in enumerate(layers):
        layer.gradient_checkpointing = index % every == 0
