"""Models: loading policies (local dirs, builtin names, GGUF files, Hub names) and the embedded
tiny model."""

from satseq.models.cache import (
    BUILTIN_MODELS,
    UnknownBuiltinModelError,
    build_tiny_model,
    builtin_dir,
    default_cache_dir,
    resolve_builtin,
)
from satseq.models.gguf import (
    BUILTIN_GGUF_MODELS,
    GGUF_PREFIX,
    GGUFImportError,
    import_gguf,
    resolve_gguf,
)
from satseq.models.loading import (
    ModelLoadError,
    is_adapter_dir,
    load_policy,
    load_tokenizer,
    resolve_model_path,
)
from satseq.models.tiny import (
    TINY_SIZES,
    TinyBuildConfig,
    TinyModelError,
    tiny_build_config,
)

__all__ = [
    "BUILTIN_GGUF_MODELS",
    "BUILTIN_MODELS",
    "GGUF_PREFIX",
    "TINY_SIZES",
    "GGUFImportError",
    "ModelLoadError",
    "TinyBuildConfig",
    "TinyModelError",
    "UnknownBuiltinModelError",
    "build_tiny_model",
    "builtin_dir",
    "default_cache_dir",
    "import_gguf",
    "is_adapter_dir",
    "load_policy",
    "load_tokenizer",
    "resolve_builtin",
    "resolve_gguf",
    "resolve_model_path",
    "tiny_build_config",
]
