"""A sharded agent's W learner ranks behind one handle: the coordinator and the runtime call a
`LearnerGroup` exactly as they call a `LearnerActor` (`group.update.remote(...)`, a streaming
`group.weight_buckets.options(num_returns="streaming").remote(...)`).

A call goes to every rank (they meet in the collectives inside it) and its result is rank 0's,
once every rank has answered (`LearnerRank.first_of`, queued on rank 0 after the call), so a
rank's failure fails the call. `ready` (re-)forms the ranks' process group first: Ray restarts
a dead rank by re-running its constructor, outside the old group, so after a loss every rank
joins a new one (and rebuilds its learner, whose state the caller then loads).

A rank killed *between* calls fails no call: Ray restarts it outside the group, and a call
reaching it would leave the other ranks waiting in their collectives for it. So every call
first asks each rank its `incarnation()` and raises `ActorRestarted` for a rank whose process
changed since the group formed, before any rank is called.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import ray

from satseq.actors.calls import RayCalls
from satseq.actors.incarnation import check_not_restarted, incarnations
from satseq.actors.learner.actor import LearnerRankActor
from satseq.actors.learner.handle import RemoteLearner
from satseq.actors.learner.rank import LearnerRank
from satseq.actors.learner.specs import LearnerSpec

RAY_CALLS = RayCalls()


class LearnerGroup(RemoteLearner):
    """An agent's learner ranks, called as one learner."""

    def __init__(self, ranks: list[Any]):
        self.ranks = ranks
        self.formed: list[Any] = []
        """Each rank's incarnation when the group last formed (pending results until asked)."""

    @property
    def actors(self) -> list[Any]:
        return self.ranks

    def call(self, method: str, options: dict[str, Any], args: tuple) -> Any:
        if method == "ready":  # (re-)form the group: see the module docstring
            return self.form()
        self.check_formed()
        calls = [getattr(rank, method).options(**options).remote(*args) for rank in self.ranks]
        if options.get("num_returns") == "streaming":
            return _rank_zero_stream(calls)
        return self.rank_zero(calls)

    def form(self) -> Any:
        """(Re-)form the ranks' process group; rank 0's answer to `join_group`."""
        address = ray.get(self.ranks[0].free_address.remote())
        joined = [rank.join_group.remote(address) for rank in self.ranks]
        self.formed = [  # each after its join
            RAY_CALLS.start(rank, LearnerRank.incarnation) for rank in self.ranks
        ]
        return self.rank_zero(joined)

    def rank_zero(self, results: list[Any]) -> Any:
        """Rank 0's result, pending until every rank's is in."""
        return RAY_CALLS.start(self.ranks[0], LearnerRank.first_of, *results)

    def check_formed(self) -> None:
        """Raise ActorRestarted for a rank that Ray restarted since the group formed."""
        if not self.formed:
            raise RuntimeError("the ranks have formed no group yet: call ready() first")
        ranks = [(rank, LearnerRank.incarnation) for rank in self.ranks]
        check_not_restarted(
            incarnations(ranks, RAY_CALLS, self.formed), incarnations(ranks, RAY_CALLS)
        )


def _rank_zero_stream(streams: list[Any]) -> Iterator[Any]:
    """Rank 0's streamed results as they come, then the other ranks' ends (they stream
    nothing; an error of theirs is raised here)."""
    yield from streams[0]
    for stream in streams[1:]:
        for ref in stream:
            ray.get(ref)


def start_learner_group(spec: LearnerSpec, rank_options: list[dict[str, Any]]) -> LearnerGroup:
    """W = len(rank_options) `LearnerRankActor`s for `spec`'s agent, rank r started with
    rank_options[r] (its name, placement, restarts). Call `ready` before anything else."""
    world = len(rank_options)
    return LearnerGroup(
        [
            LearnerRankActor.options(**options).remote(
                dataclasses.replace(spec, rank=rank, workers=world)
            )
            for rank, options in enumerate(rank_options)
        ]
    )
