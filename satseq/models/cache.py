"""The builtin-model cache: `builtin:tiny*` names resolve to a directory built once per config.

A build lives in `<cache_dir>/<name>-<fingerprint>/`, where the fingerprint hashes the build
config (size, variant, seed, warm-start hyperparameters, format version) and the text it trains
on. A directory under that name is always complete: builds happen in a temporary sibling that is
renamed into place at the end, so a crash mid-build leaves only a temporary directory, which the
next build removes. A lock file makes concurrent resolvers (say, three agents' actors starting
together) wait for one build instead of each running their own.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from satseq.models.corpus import Variant
from satseq.models.teacher import QUICKSTART_TEACHERS
from satseq.models.tiny import TinyBuildConfig, tiny_build_config, write_tiny_model

logger = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS: dict[str, TinyBuildConfig] = {
    "builtin:tiny": tiny_build_config("quickstart", "steps"),
    "builtin:tiny-tool": tiny_build_config("quickstart", "tool"),
    # the quickstart team (configs/quickstart.yaml): a teacher and a seed each
    **{
        f"builtin:tiny-carry-{k}": tiny_build_config("quickstart", "carry", k, teacher=teacher)
        for k, teacher in enumerate(QUICKSTART_TEACHERS)
    },
}


class UnknownBuiltinModelError(ValueError):
    """A `builtin:` name that is not one of BUILTIN_MODELS."""


def default_cache_dir() -> Path:
    """`$SATSEQ_CACHE/models`, or `~/.cache/satseq/models` when SATSEQ_CACHE is unset."""
    root = os.environ.get("SATSEQ_CACHE") or Path.home() / ".cache" / "satseq"
    return Path(root).expanduser() / "models"


def builtin_build_config(name: str) -> TinyBuildConfig:
    """The build config behind a builtin name (all of the quickstart size)."""
    if name not in BUILTIN_MODELS:
        raise UnknownBuiltinModelError(
            f"unknown builtin model {name!r}; use one of {sorted(BUILTIN_MODELS)}"
        )
    return BUILTIN_MODELS[name]


def builtin_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    """Where builtin model `name` is cached in `cache_dir` (once built)."""
    fingerprint = builtin_build_config(name).fingerprint()
    model_name = name.removeprefix(BUILTIN_PREFIX)
    return Path(cache_dir or default_cache_dir()) / f"{model_name}-{fingerprint}"


def resolve_builtin(name: str, cache_dir: str | Path | None = None) -> Path:
    """The directory of builtin model `name`, building it into `cache_dir` if it is missing."""
    config = builtin_build_config(name)
    directory = builtin_dir(name, cache_dir)

    def build(out_dir: Path) -> None:
        logger.info("building %s into %s (once; about a minute)", name, directory)
        write_tiny_model(config, out_dir)

    return cached_build(directory, build)


def build_tiny_model(
    out_dir: str | Path,
    size: str = "quickstart",
    variant: Variant = "steps",
    seed: int = 0,
    warm_start_steps: int | None = None,
) -> Path:
    """Build a tiny model into `out_dir` (created if missing) and return its path.

    `variant="tool"` warm-starts on tool-use solutions asked with `TOOL_PROMPT_FORMAT`'s
    instruction. The quickstart size takes about a minute on one CPU core. A builtin model's
    build config (the defaults are `builtin:tiny`'s) is built once into the model cache and
    copied from there: equal configs build equal models.
    """
    config = tiny_build_config(size, variant, seed, warm_start_steps)
    builtin = next((name for name, known in BUILTIN_MODELS.items() if known == config), None)
    if builtin is None:
        return write_tiny_model(config, out_dir)
    shutil.copytree(resolve_builtin(builtin), out_dir, dirs_exist_ok=True)
    return Path(out_dir)


def cached_build(directory: Path, build: Callable[[Path], object]) -> Path:
    """`directory`, after running `build(temporary_dir)` and renaming it there if it is missing."""
    if directory.is_dir():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(directory.with_name(f".{directory.name}.lock")):
        if directory.is_dir():  # built by whoever held the lock before us
            return directory
        temporary_prefix = f".{directory.name}.tmp-"
        for leftover in directory.parent.glob(temporary_prefix + "*"):
            shutil.rmtree(leftover, ignore_errors=True)  # from a build that crashed
        temporary = Path(tempfile.mkdtemp(prefix=temporary_prefix, dir=directory.parent))
        try:
            build(temporary)
            temporary.rename(directory)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
    return directory


@contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
