"""Resume state, written atomically (design §8): a crash mid-write never corrupts a checkpoint.

Layout: `checkpoints/stage_<k>/`, the run's state after stage k:
- `learner_<i>.pt`: agent i's learner state (master weights, optimiser, β, RNG), written by the
  learner itself, so no learner's state travels through the object store or the coordinator;
- `run.pt`: the coordinator's state (recipe, RNG, agent paths), written last. Its presence is what
  makes the checkpoint complete: a stage directory without it is debris of an interrupted save.

Every file is written with `satseq.files.write_atomically` (temp file, fsync, rename, fsync of the
directory). Older checkpoints beyond `keep` are removed only after the new one is complete.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import torch

from satseq.files import remove_directory, write_atomically

STAGE_PATTERN = re.compile(r"^stage_(\d+)$")
RUN_STATE = "run.pt"


def stage_directory(directory: Path, stage: int) -> Path:
    return directory / f"stage_{stage}"


def learner_state_path(directory: Path, stage: int, agent_index: int) -> Path:
    """Where agent `agent_index`'s learner writes its state after `stage`."""
    return stage_directory(directory, stage) / f"learner_{agent_index}.pt"


def run_state_path(directory: Path, stage: int) -> Path:
    return stage_directory(directory, stage) / RUN_STATE


def save_run_state(directory: Path, stage: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Complete the checkpoint of `stage` (its learner files already written) with the run's
    state; then remove all but the newest `keep` complete checkpoints and any incomplete one."""
    path = write_atomically(run_state_path(directory, stage), lambda f: torch.save(state, f))
    kept = set(checkpoint_stages(directory)[-keep:])
    for old in directory.iterdir():
        match = STAGE_PATTERN.match(old.name)
        if match and int(match.group(1)) not in kept:
            shutil.rmtree(old, ignore_errors=True)
    return path


def checkpoint_stages(directory: Path) -> list[int]:
    """The stages with a complete checkpoint, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(
        int(m.group(1))
        for p in directory.iterdir()
        if (m := STAGE_PATTERN.match(p.name)) and (p / RUN_STATE).is_file()
    )


def load_latest_run_state(directory: Path) -> tuple[int, dict[str, Any]] | None:
    """(stage, run state) of the newest complete checkpoint, or None if there is none; its
    learners' files are at `learner_state_path(directory, stage, i)`."""
    stages = checkpoint_stages(directory)
    if not stages:
        return None
    stage = stages[-1]
    state = torch.load(run_state_path(directory, stage), map_location="cpu", weights_only=False)
    return stage, state


def prune_saved_stages(
    output_dir: Path, agents: list[str], keep_last: int, needed: set[Path]
) -> list[Path]:
    """Remove the agents' saved stages (`agent_<name>/stage_<k>/`) of all but the newest
    `keep_last` stages, except the directories in `needed` (a model the run still reads: a
    swapped-in agent's path); each by an atomic rename first. Returns what was removed."""
    saved = {
        (int(m.group(1)), path)
        for name in agents
        if (output_dir / f"agent_{name}").is_dir()
        for path in (output_dir / f"agent_{name}").iterdir()
        if (m := STAGE_PATTERN.match(path.name))
    }
    newest = sorted({stage for stage, _ in saved})[-keep_last:]
    keep = {path.resolve() for path in needed}
    removed = []
    for stage, path in sorted(saved):
        if stage not in newest and path.resolve() not in keep:
            remove_directory(path)
            removed.append(path)
    return removed
