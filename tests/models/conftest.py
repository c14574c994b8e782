"""Session fixtures: the builtin tiny models, in the cache every test shares (`builtin_models`).

What a cached build holds is what the current code builds as long as a change to the build bumps
its fingerprint (`satseq.models.tiny`); CI starts with an empty cache, so it builds afresh.
"""

from pathlib import Path

import pytest

from satseq.models import load_policy, resolve_builtin
from satseq.models.cache import default_cache_dir


@pytest.fixture(scope="session")
def satseq_cache(builtin_models) -> Path:
    """The `$SATSEQ_CACHE` root the builtin models were built under."""
    return default_cache_dir().parent


@pytest.fixture(scope="session")
def model_cache_dir(satseq_cache: Path) -> Path:
    """Where builtin models are built: the default place under `satseq_cache`."""
    return satseq_cache / "models"


@pytest.fixture(scope="session")
def tiny_model_dir(model_cache_dir: Path) -> Path:
    return resolve_builtin("builtin:tiny", cache_dir=model_cache_dir)


@pytest.fixture(scope="session")
def tiny_tool_model_dir(model_cache_dir: Path) -> Path:
    return resolve_builtin("builtin:tiny-tool", cache_dir=model_cache_dir)


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir: Path):
    """(model, tokenizer) of builtin:tiny, in float32 on the CPU."""
    return load_policy(tiny_model_dir, dtype="float32")
