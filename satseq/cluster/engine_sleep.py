"""Colocated engines (`trainer.offload: idle_agents`): the rollout engines sleep while the
learners work and wake up for generation, so both fit on one device. The runtime and the
weight sync ask for the state they need; each change is one round of calls."""

from __future__ import annotations

from typing import Any

from satseq.actors.calls import ActorCalls
from satseq.actors.rollout import RolloutWorker


class EngineSleep:
    """Whether the rollout workers' engines are awake; `set_awake` is a no-op unless the
    engines are colocated with the learners."""

    def __init__(self, rollouts: list[Any], calls: ActorCalls, colocated: bool):
        self.rollouts = rollouts
        self.calls = calls
        self.colocated = colocated
        self.awake = True

    def set_awake(self, awake: bool) -> None:
        """Colocated: every rollout worker's engines wake up or go to sleep, once per change."""
        if self.colocated and awake != self.awake:
            method = RolloutWorker.wake_up if awake else RolloutWorker.sleep
            self.calls.wait([self.calls.start(worker, method) for worker in self.rollouts])
            self.awake = awake
