"""Session fixtures: the builtin tiny models, built once per test session into a private cache.

A private cache (not `~/.cache/satseq`) makes every session test what the current code builds.
"""

from pathlib import Path

import pytest

from satseq.models import load_policy, resolve_builtin


@pytest.fixture(scope="session")
def satseq_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private `$SATSEQ_CACHE` root."""
    return tmp_path_factory.mktemp("satseq-cache")


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
