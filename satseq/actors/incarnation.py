"""Whether an actor is still the process its callers gave their state to.

Ray restarts a dead actor (`max_restarts`) in a new process under the same actor id, by
re-running its constructor. A call in flight when it died fails; a call made after the restart
does not, and reaches an actor on its constructor's state (a learner on its initial weights). So
each actor answers `incarnation()` with `PROCESS_ID`, and a caller that recorded the answers
when it set the actors' state finds out with `check_not_restarted` which one lost it since.
"""

from __future__ import annotations

import uuid
from typing import Any

PROCESS_ID = uuid.uuid4().hex
"""This process's identity: what an actor's `incarnation()` answers."""


class ActorRestarted(RuntimeError):
    """An actor Ray restarted since its caller last gave it the run's state: it answers, but
    from its constructor's state. The coordinator treats it as the actor's loss."""

    def __init__(self, actor_id: str):
        super().__init__(f"actor {actor_id} was restarted by Ray since its state was last set")
        self.actor_id = actor_id


def incarnations(actors: list[Any], asked: list[Any] | None = None) -> dict[str, str]:
    """{actor id (hex): its `incarnation()`}, asked now, or `asked`: the pending answers of an
    earlier `incarnation()` call to each actor."""
    import ray  # here: the learner imports this module, and imports without Ray

    found = ray.get(asked if asked is not None else [a.incarnation.remote() for a in actors])
    return {actor._actor_id.hex(): process for actor, process in zip(actors, found, strict=True)}


def check_not_restarted(before: dict[str, str], now: dict[str, str]) -> None:
    """Raise ActorRestarted for an actor whose process changed from `before` to `now` (actors
    in only one of them, started or stopped on purpose, are not compared)."""
    for actor_id, process in now.items():
        if before.get(actor_id, process) != process:
            raise ActorRestarted(actor_id)
