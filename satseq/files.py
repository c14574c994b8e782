"""Files that a crash never leaves half-written (DESIGN §8: nothing is lost).

Each is written to a hidden temporary file in the same directory, fsynced, then renamed over the
final name (rename is atomic on POSIX), and the directory is fsynced so that the rename itself
survives a crash. A reader sees the old file or the new one, never a mix.
"""

from __future__ import annotations

import os
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
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


def write_text_atomically(path: str | Path, text: str) -> Path:
    """`path.write_text(text)` (UTF-8), atomically."""
    return write_atomically(path, lambda handle: handle.write(text.encode("utf-8")))
