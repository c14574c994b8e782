"""Resume state, written atomically (design §8): a crash mid-write never corrupts a checkpoint.

Layout: `checkpoints/stage_<k>/`, the run's state after stage k:
- `learner_<i>.pt`: agent i's learner state (master weights, optimiser, β, RNG), written by the
  learner itself, so no learner's state travels through the object store or the coordinator;
- `run.pt`: the coordinator's state (recipe, RNG, agent paths), written last. Its presence is what
  makes the checkpoint complete: a stage directory without it is debris of an interrupted save.

Every file is written with `satseq.files.write_atomically` (temp file, fsync, rename, fsync of the
directory). Older checkpoints beyond `keep` are removed only after the new one is complete. With
`output.storage` (`satseq.storage.StorageMirror`) each file is also uploaded, `run.pt` last, and
a checkpoint complete there counts as one here: a resume downloads what this node lacks.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import torch

from satseq.files import remove_directory, write_atomically
from satseq.storage import StorageMirror

STAGE_PATTERN = re.compile(r"^stage_(\d+)$")
RUN_STATE = "run.pt"


def run_storage(output_dir: Path, uri: str | None) -> StorageMirror | None:
    """The mirror of the run's outputs at `output.storage`; None without one."""
    return None if uri is None else StorageMirror(output_dir, uri)


def stage_directory(directory: Path, stage: int) -> Path:
    return directory / f"stage_{stage}"


def learner_state_path(directory: Path, stage: int, agent_index: int) -> Path:
    """Where agent `agent_index`'s learner writes its state after `stage`."""
    return stage_directory(directory, stage) / f"learner_{agent_index}.pt"


def run_state_path(directory: Path, stage: int) -> Path:
    return stage_directory(directory, stage) / RUN_STATE


def save_run_state(
    directory: Path,
    stage: int,
    state: dict[str, Any],
    keep: int = 2,
    storage: StorageMirror | None = None,
) -> Path:
    """Complete the checkpoint of `stage` (its learner files already written, and uploaded to
    `storage` when given) with the run's state, here and then at `storage`; then remove all but
    the newest `keep` complete checkpoints and any incomplete one, in both."""
    path = write_atomically(run_state_path(directory, stage), lambda f: torch.save(state, f))
    if storage is not None:
        storage.upload(path)
    names = _stage_names(directory, storage)  # listed once, here and at `storage`
    kept = set(_complete_stages(directory, names, storage)[-keep:])
    for name in names:
        if int(STAGE_PATTERN.match(name).group(1)) not in kept:
            shutil.rmtree(directory / name, ignore_errors=True)
            if storage is not None:
                storage.remove(directory / name)
    return path


def checkpoint_stages(directory: Path, storage: StorageMirror | None = None) -> list[int]:
    """The stages with a complete checkpoint, here or at `storage`, oldest first."""
    return _complete_stages(directory, _stage_names(directory, storage), storage)


def _complete_stages(directory: Path, names: set[str], storage: StorageMirror | None) -> list[int]:
    """The stages among `names` whose `run.pt` is here or at `storage`, oldest first."""
    return sorted(
        int(STAGE_PATTERN.match(name).group(1))
        for name in names
        if (directory / name / RUN_STATE).is_file()
        or (storage is not None and storage.exists(directory / name / RUN_STATE))
    )


def _stage_names(directory: Path, storage: StorageMirror | None) -> set[str]:
    """The `stage_<k>` entries of `directory`, here and at `storage`."""
    names = {p.name for p in directory.iterdir()} if directory.is_dir() else set()
    if storage is not None:
        names |= set(storage.names(directory))
    return {name for name in names if STAGE_PATTERN.match(name)}


def load_latest_run_state(
    directory: Path, storage: StorageMirror | None = None
) -> tuple[int, dict[str, Any]] | None:
    """(stage, run state) of the newest complete checkpoint, here or at `storage` (then
    downloaded), or None if there is none; its learners' files are at
    `learner_state_path(directory, stage, i)`, here or at `storage`."""
    stages = checkpoint_stages(directory, storage)
    if not stages:
        return None
    stage = stages[-1]
    path = run_state_path(directory, stage)
    if storage is not None:
        storage.fetch(path)
    state = torch.load(path, map_location="cpu", weights_only=False)
    return stage, state


def prune_saved_stages(
    output_dir: Path,
    agents: list[str],
    keep_last: int,
    needed: set[Path],
    storage: StorageMirror | None = None,
) -> list[Path]:
    """Remove the agents' saved stages (`agent_<name>/stage_<k>/`, here and at `storage`) of
    all but the newest `keep_last` stages, except the directories in `needed` (a model the run
    still reads: a swapped-in agent's path); each here by an atomic rename first. Returns what
    was removed."""
    saved = {
        (int(STAGE_PATTERN.match(name).group(1)), output_dir / f"agent_{agent}" / name)
        for agent in agents
        for name in _stage_names(output_dir / f"agent_{agent}", storage)
    }
    newest = sorted({stage for stage, _ in saved})[-keep_last:]
    keep = {path.resolve() for path in needed}
    removed = []
    for stage, path in sorted(saved):
        if stage not in newest and path.resolve() not in keep:
            if path.exists():
                remove_directory(path)
            if storage is not None:
                storage.remove(path)
            removed.append(path)
    return removed
