"""One of a sharded agent's W learner ranks (design §11)."""

from __future__ import annotations

from typing import Any

import torch

from satseq.actors.learner.learner import Learner
from satseq.actors.learner.specs import LearnerSpec
from satseq.actors.sharding import ShardGroup, join_group


class LearnerRank(Learner):
    """One of a sharded agent's W learner ranks (`LearnerRankActor`). It builds its learner only
    once the ranks have formed their process group (`join_group`), so a rank Ray restarts
    after a loss waits for the group to form again instead of blocking its constructor. Rank 0's
    `free_address` is where the group meets."""

    def __init__(self, spec: LearnerSpec):
        self.spec = spec

    def join_group(self, address: str) -> bool:
        """(Re-)form the group at `address` with the other ranks, and build this rank's learner
        (the model sharded afresh: after a loss the caller loads the stage's state)."""
        spec = self.spec
        self.__dict__.clear()
        self.spec = spec
        join_group(address, ShardGroup(spec.rank, spec.workers), torch.device(spec.device))
        Learner.__init__(self, spec)
        return True

    def first_of(self, *results: Any) -> Any:
        """Rank 0's result of a call that every rank answered (`LearnerGroup`): the ranks'
        results are its arguments, so it runs once they are all in, and a rank's error fails
        it. Called on rank 0, whose process has them deserialised in no time (a Ray task would
        start a process of its own to hold them)."""
        return results[0]
