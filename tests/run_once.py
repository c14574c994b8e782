"""Outputs that one pytest run builds once and its xdist workers share, read-only."""

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """The directory `name` after `build(directory)`, run once per pytest run however many
    xdist workers ask: the first builds it under a lock, the others wait and read it."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    directory, done = root / name, root / f"{name}.done"
    with FileLock(root / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)  # a build that failed in another worker
            directory.mkdir()
            build(directory)
            done.touch()
    return directory
