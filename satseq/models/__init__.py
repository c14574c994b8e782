"""Models: loading policies (local dirs, builtin names, Hub names) and the embedded tiny model."""

from satseq.models.cache import (
    BUILTIN_MODELS,
    UnknownBuiltinModelError,
    default_cache_dir,
    resolve_builtin,
)
from satseq.models.loading import ModelLoadError, load_policy, load_tokenizer, resolve_model_path
from satseq.models.tiny import (
    TINY_SIZES,
    TinyBuildConfig,
    TinyModelError,
    build_tiny_model,
    tiny_build_config,
)

__all__ = [
    "BUILTIN_MODELS",
    "TINY_SIZES",
    "ModelLoadError",
    "TinyBuildConfig",
    "TinyModelError",
    "UnknownBuiltinModelError",
    "build_tiny_model",
    "default_cache_dir",
    "load_policy",
    "load_tokenizer",
    "resolve_builtin",
    "resolve_model_path",
    "tiny_build_config",
]
