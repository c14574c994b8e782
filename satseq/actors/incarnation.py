"""Whether an actor is still the process its callers gave their state to.

Ray restarts a dead actor (`max_restarts`) in a new process under the same actor id, by
re-running its constructor. A call in flight when it died fails; a call made after the restart
does not, and reaches an actor on its constructor's state (a learner on its initial weights). So
each actor answers `incarnation()` with `PROCESS_ID`, and a caller that recorded the answers
when it set the actors' state finds out with `check_not_restarted` which one lost it since.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from satseq.actors.calls import ActorCalls

PROCESS_ID = uuid.uuid4().hex
"""This process's identity: what an actor's `incarnation()` answers."""


class ActorRestarted(RuntimeError):
    """An actor Ray restarted since its caller last gave it the run's state: it answers, but
    from its constructor's state. The coordinator treats it as the actor's loss."""

    def __init__(self, actor_id: str):
        super().__init__(f"actor {actor_id} was restarted by Ray since its state was last set")
        self.actor_id = actor_id


def incarnations(
    actors: list[tuple[Any, Callable]], calls: ActorCalls, asked: list[Any] | None = None
) -> dict[str, str]:
    """{actor key: its `incarnation()`} of each (actor, its `incarnation` method), asked now,
    or `asked`: the pending answers of an earlier call to each."""
    if asked is None:
        asked = [calls.start(actor, method) for actor, method in actors]
    found = calls.wait(asked)
    return {actor_key(actor): process for (actor, _), process in zip(actors, found, strict=True)}


def actor_key(actor: Any) -> str:
    """A Ray actor's id (the same across its restarts), or a plain object's identity."""
    actor_id = getattr(actor, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else f"in-process-{id(actor):x}"


def check_not_restarted(before: dict[str, str], now: dict[str, str]) -> None:
    """Raise ActorRestarted for an actor whose process changed from `before` to `now` (actors
    in only one of them, started or stopped on purpose, are not compared)."""
    for actor_id, process in now.items():
        if before.get(actor_id, process) != process:
            raise ActorRestarted(actor_id)
