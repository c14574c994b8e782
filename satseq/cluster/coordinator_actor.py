"""The coordinator's Ray actor: the stage loop (`coordinator.Coordinator`) in its own process.

This module imports no more than Ray, so the driver that creates the actor starts without torch,
transformers or the learner (about 9 s of every `satseq train` on 2 cores); the actor's process
imports them when it starts, as every learner does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ray

if TYPE_CHECKING:
    from satseq.config import RunConfig


@ray.remote(num_cpus=0, max_concurrency=2)  # 2: the driver polls `get_progress` during a stage
class CoordinatorActor:
    def __init__(self, config: RunConfig, output_dir: str, resume: bool = False):
        from satseq.cluster.coordinator import Coordinator

        self.coordinator = Coordinator(config, output_dir, resume)

    def run_stage(self) -> dict[str, Any]:
        return self.coordinator.run_stage()

    def get_progress(self) -> dict[str, Any]:
        return self.coordinator.get_progress()

    def next_stage(self) -> int:
        return self.coordinator.next_stage()

    def finished(self) -> bool:
        return self.coordinator.finished()

    def start_warnings(self) -> list[str]:
        return self.coordinator.start_warnings

    def close(self) -> list[str]:
        return self.coordinator.close()
