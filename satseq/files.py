"""Files and directories that a crash never leaves half-written (design §8: nothing is lost).

Each is written to a hidden temporary name in the same directory, fsynced, then renamed over the
final name (rename is atomic on POSIX), and the directory is fsynced so that the rename itself
survives a crash. A reader sees the old file or the new one, never a mix. A directory is removed
by a rename to a hidden name first, so a crash mid-removal leaves no half of it under its name.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomically(path: str | Path, save: Callable[[BinaryIO], object]) -> Path:
    """Call save(binary file object) into a temp file next to `path`, then atomically rename it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            save(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path


def write_text_atomically(path: str | Path, text: str) -> Path:
    """`path.write_text(text)` (UTF-8), atomically."""
    return write_atomically(path, lambda handle: handle.write(text.encode("utf-8")))


def write_directory_atomically(directory: str | Path, write: Callable[[Path], object]) -> Path:
    """Call write(a hidden sibling directory), then rename it to `directory` (an existing one is
    replaced, removed only once the new one is in place)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.partial."))
    try:
        write(partial)
        for file in partial.rglob("*"):
            if file.is_file():
                with file.open("rb") as handle:
                    os.fsync(handle.fileno())
        replaced = _hide(directory) if directory.exists() else None
        os.replace(partial, directory)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    _fsync_directory(directory.parent)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    return directory


def remove_directory(directory: str | Path) -> None:
    """Remove `directory`: renamed to a hidden name first (atomic), then deleted."""
    hidden = _hide(Path(directory))
    _fsync_directory(hidden.parent)
    shutil.rmtree(hidden, ignore_errors=True)


def _hide(directory: Path) -> Path:
    hidden = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.removed."))
    os.replace(directory, hidden / directory.name)
    return hidden


def _fsync_directory(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
