"""What a started team is, as the runtime and the weight sync read it: the agents and their
learners, models and tokenizers, the rollout workers and the sandbox pool (`StartedTeam`); how
agent i gets a fresh learner (`LearnerFactory`, for swaps); how weights reach the engines
(`SyncSettings`). `satseq.cluster.team` builds them on Ray or in this process."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from satseq.actors.learner.handle import LearnerHandle
from satseq.actors.weight_transfer import TransferBackend
from satseq.config import RunConfig
from satseq.launch.agent_models import agent_model_dir


@dataclass
class StartedTeam:
    """The team's members, agent i at index i of each list. A swap replaces agent i's entries
    in place (`TeamRuntime.replace_agent`), so whoever holds the team sees the new learner."""

    agents: list[str]
    """The agents' names, in team order."""
    agent_paths: list[str]
    """Each agent's model as configured (`team.agents[i].path`, or a swap's `path`)."""
    model_dirs: list[str]
    """The directory each agent's learner and engines load (a LoRA agent's: its adapter's)."""
    tokenizers: list
    learners: list[LearnerHandle]
    """Agent i's learner, whatever runs it (`satseq.actors.learner.handle`)."""
    rollouts: list
    sandbox: Any = None
    """The sandbox pool's actor with tools, else None."""


@dataclass(frozen=True)
class SyncSettings:
    """How the weight sync reaches the engines: whether they sleep while the learners work
    (colocated on the learners' devices), its bucket size, and its collective's backend (None:
    the object store)."""

    colocated: bool = False
    bucket_mb: float = 512.0
    weight_transfer: TransferBackend | None = None


class LearnerFactory(ABC):
    """Starts agents' learners of one kind (on Ray or in this process), so that a swap can give
    agent i a fresh learner on another model (the old one stops itself: `LearnerHandle.stop`)."""

    def __init__(self, config: RunConfig):
        self.config = config

    def model_dir(self, i: int, path: str | None = None) -> str:
        """The directory agent i's learner and engines load for the model at `path` (None: as
        configured)."""
        return agent_model_dir(self.config, i, path)

    @abstractmethod
    def start(self, i: int, path: str | None = None) -> LearnerHandle:
        """A fresh learner for agent i on the model at `path` (None: as configured)."""
