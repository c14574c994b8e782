"""Resume state, written atomically (DESIGN §8): a crash mid-write never corrupts a checkpoint.

Layout: `checkpoints/stage_<k>.pt`, each a complete torch.save of the run's state after stage k,
written with `satseq.files.write_atomically` (temp file, fsync, rename, fsync of the directory).
Older checkpoints beyond `keep` are removed only after the new one is in place.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from satseq.files import write_atomically

CHECKPOINT_PATTERN = re.compile(r"^stage_(\d+)\.pt$")


def save_checkpoint(directory: Path, stage: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write the state after `stage` as checkpoints/stage_<stage>.pt; keep the newest `keep`."""
    path = directory / f"stage_{stage}.pt"
    write_atomically(path, lambda handle: torch.save(state, handle))
    for old in sorted(checkpoint_stages(directory))[:-keep]:
        (directory / f"stage_{old}.pt").unlink(missing_ok=True)
    return path


def checkpoint_stages(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(
        int(m.group(1)) for p in directory.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name))
    )


def load_latest_checkpoint(directory: Path) -> tuple[int, dict[str, Any]] | None:
    """(stage, state) of the newest complete checkpoint, or None if there is none."""
    stages = checkpoint_stages(directory)
    if not stages:
        return None
    stage = stages[-1]
    state = torch.load(directory / f"stage_{stage}.pt", map_location="cpu", weights_only=False)
    return stage, state
