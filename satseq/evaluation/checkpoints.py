"""Which weights a team has: each agent's HF model directory (a LoRA agent's: its PEFT adapter
directory, which names its base) in a checkpoint directory.

Two layouts are accepted (design §8):

- a training output directory, `agent_<name>/stage_<k>/`: each agent's latest saved stage, or
  stage `k` for every agent when one is asked for;
- a directory of per-agent HF model directories, `<name>/config.json` (or adapter directories,
  `<name>/adapter_config.json`): one agent per directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from satseq.models import is_adapter_dir

AGENT_PREFIX = "agent_"
STAGE_DIR = re.compile(r"stage_(\d+)")


class CheckpointError(ValueError):
    """A checkpoint directory does not hold a team; the message says what was expected."""


@dataclass(frozen=True)
class TeamCheckpoint:
    """agent_paths: agent name → HF model dir, in name order. stages: the stage each agent's
    dir is from, or None for per-agent dirs that are not a training output."""

    agent_paths: dict[str, Path]
    stages: dict[str, int | None]

    @property
    def agent_names(self) -> list[str]:
        return list(self.agent_paths)


def resolve_team(checkpoint_dir: str | Path, stage: int | None = None) -> TeamCheckpoint:
    root = Path(checkpoint_dir).expanduser()
    if not root.is_dir():
        raise CheckpointError(f"checkpoint dir {root}: not a directory")
    agent_dirs = sorted(p for p in root.glob(f"{AGENT_PREFIX}*") if p.is_dir())
    if agent_dirs:
        return _training_output(root, agent_dirs, stage)
    model_dirs = sorted(p for p in root.iterdir() if _is_model_dir(p))
    if model_dirs:
        if stage is not None:
            raise CheckpointError(
                f"checkpoint dir {root} holds per-agent model dirs, which have no stages; "
                "drop --stage"
            )
        return TeamCheckpoint({p.name: p for p in model_dirs}, {p.name: None for p in model_dirs})
    raise CheckpointError(
        f"checkpoint dir {root} holds no team: expected a training output dir "
        f"({AGENT_PREFIX}<name>/stage_<k>/) or one HF model dir per agent (<name>/config.json)"
    )


def saved_stages(agent_dir: Path) -> dict[int, Path]:
    """Stage number → HF dir of every complete stage save under `agent_dir`."""
    stages = {}
    for path in agent_dir.iterdir():
        match = STAGE_DIR.fullmatch(path.name)
        if match and _is_model_dir(path):
            stages[int(match.group(1))] = path
    return stages


def _training_output(root: Path, agent_dirs: list[Path], stage: int | None) -> TeamCheckpoint:
    paths: dict[str, Path] = {}
    stages: dict[str, int | None] = {}
    for agent_dir in agent_dirs:
        name = agent_dir.name.removeprefix(AGENT_PREFIX)
        saved = saved_stages(agent_dir)
        if not saved:
            raise CheckpointError(
                f"{agent_dir}: no saved stage (stage_<k>/ with config.json or adapter_config.json)"
            )
        chosen = max(saved) if stage is None else stage
        if chosen not in saved:
            raise CheckpointError(
                f"{agent_dir}: no stage {stage}; saved stages are {sorted(saved)}"
            )
        paths[name], stages[name] = saved[chosen], chosen
    return TeamCheckpoint(paths, stages)


def _is_model_dir(path: Path) -> bool:
    """A full model's HF directory or a LoRA agent's adapter directory."""
    return path.is_dir() and ((path / "config.json").is_file() or is_adapter_dir(path))
