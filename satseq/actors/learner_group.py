"""A sharded agent's W learner ranks behind one handle: the coordinator and the runtime call a
`LearnerGroup` exactly as they call a `LearnerActor` (`group.update.remote(...)`, a streaming
`group.weight_buckets.options(num_returns="streaming").remote(...)`).

A call goes to every rank (they meet in the collectives inside it) and its result is rank 0's,
once every rank has answered, so a rank's failure fails the call. `ready` (re-)forms the ranks'
process group first: Ray restarts a dead rank by re-running its constructor, outside the old
group, so after a loss every rank joins a new one (and rebuilds its learner, whose state the
caller then loads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import ray

from satseq.actors.learner import LearnerRankActor, LearnerSpec


@ray.remote(num_cpus=0)
def _rank_zero(*results: Any) -> Any:
    """Rank 0's result, once every rank's is in (Ray resolves them before this runs)."""
    return results[0]


class LearnerGroup:
    """An agent's learner ranks, called as one learner."""

    def __init__(self, ranks: list[Any]):
        self.ranks = ranks

    def __getattr__(self, method: str) -> _GroupMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _GroupMethod(self.ranks, method)


class _GroupMethod:
    def __init__(self, ranks: list[Any], method: str, options: dict[str, Any] | None = None):
        self.ranks = ranks
        self.method = method
        self.options_ = options or {}

    def options(self, **options: Any) -> _GroupMethod:
        return _GroupMethod(self.ranks, self.method, options)

    def remote(self, *args: Any) -> Any:
        if self.method == "ready":  # (re-)form the group: see the module docstring
            address = ray.get(self.ranks[0].rendezvous_address.remote())
            return _rank_zero.remote(*[rank.join_group.remote(address) for rank in self.ranks])
        calls = [
            getattr(rank, self.method).options(**self.options_).remote(*args) for rank in self.ranks
        ]
        if self.options_.get("num_returns") == "streaming":
            return _rank_zero_stream(calls)
        return _rank_zero.remote(*calls)


def _rank_zero_stream(streams: list[Any]) -> Iterator[Any]:
    """Rank 0's streamed results as they come, then the other ranks' ends (they stream
    nothing; an error of theirs is raised here)."""
    yield from streams[0]
    for stream in streams[1:]:
        for ref in stream:
            ray.get(ref)


def learner_actors(learner: Any) -> list[Any]:
    """The Ray actors behind a learner handle: a group's ranks, or the actor itself."""
    return learner.ranks if isinstance(learner, LearnerGroup) else [learner]


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
