"""Actor and node loss during a stage ([2.5]): what died, waiting for Ray to restart it, and the
bound on how often a stage may be retried.

Every training actor is started with `max_restarts=-1`: when its process (or its node) dies, Ray
starts it again in its placement-group bundle, under the same handle, by re-running its
constructor. The coordinator then puts the whole team back to the state at the start of the
stage (`Coordinator._reset_to_stage_start`) and runs the stage again; since a stage is a
deterministic function of that state, the retried stage gives the uninterrupted run's metrics.

An actor that dies *between* two calls fails no call: Ray restarts it, and the next call reaches
the new process, which holds its constructor's state (a learner its initial weights, a rollout
actor its engines' initial weights). So before a stage's checkpoint is completed the coordinator
asks every actor its `incarnation()` (`satseq.actors.incarnation`); one that changed since the
stage began is an `ActorRestarted`, a loss like any other: the stage is retried from its start.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError

from satseq.actors.incarnation import ActorRestarted

log = logging.getLogger(__name__)

ACTOR_LOSS = (RayActorError, ObjectLostError, ActorRestarted)
"""What a call raises when an actor died (or is restarting), or its node and objects are gone,
and what the coordinator raises on finding an actor restarted between calls."""
FAULT_KINDS = ("learner", "rollout", "sandbox", "node")
RESTARTED_ACTOR = {"max_restarts": -1}
"""Ray options of every training actor: Ray restarts it whenever it dies."""


class StageFailed(RuntimeError):
    """A stage failed more than `trainer.max_stage_retries` times; the message says what died."""


class FaultLog:
    """The faults of the stage in progress, bounded by `max_retries`, and of the whole run."""

    def __init__(self, max_retries: int):
        self.max_retries = max_retries
        self.stage_faults: Counter[str] = Counter()
        self.total = 0
        self.recovery_seconds = 0.0

    def record(self, kind: str, stage: int, error: BaseException) -> None:
        """Count one fault; raises StageFailed when the stage has no retry left."""
        self.stage_faults[kind] += 1
        self.total += 1
        retries = sum(self.stage_faults.values())
        log.warning(
            "stage %d: a %s died (%s); retry %d of %d",
            stage,
            kind,
            error,
            retries,
            self.max_retries,
        )
        if retries > self.max_retries:
            died = ", ".join(f"{kind} {n}×" for kind, n in sorted(self.stage_faults.items()))
            raise StageFailed(
                f"stage {stage} failed {retries} times (trainer.max_stage_retries="
                f"{self.max_retries}); what died: {died}. Last error: {error}"
            ) from error

    def stage_metrics(self) -> dict[str, float]:
        """`faults/<kind>` (this stage's recoveries so far) and, after a recovery,
        `time/recovery`."""
        metrics: dict[str, float] = {
            f"faults/{kind}": self.stage_faults[kind] for kind in FAULT_KINDS
        }
        if self.stage_faults:
            metrics["time/recovery"] = self.recovery_seconds
        return metrics

    def next_stage(self) -> None:
        """The stage is done: the next one starts with no faults."""
        self.stage_faults.clear()
        self.recovery_seconds = 0.0


def fault_kind(error: BaseException, roles: dict[str, str]) -> str:
    """Which kind of actor the error says died: roles maps actor ids (hex) to kinds; an error that
    names no known actor (a lost object, a dead node) is a "node" fault."""
    actor_id = getattr(error, "actor_id", None)
    return roles.get(actor_id, "node") if actor_id else "node"


def actor_roles(**handles: list[Any]) -> dict[str, str]:
    """{actor id (hex): kind} for lists of actor handles given by kind."""
    return {
        handle._actor_id.hex(): kind
        for kind, group in handles.items()
        for handle in group
        if handle
    }


def wait_until_alive(pings: list[tuple[Any, Callable]], timeout_s: float = 600.0) -> None:
    """Return once every (actor, method) answers (Ray restarts the dead ones), or raise."""
    deadline = time.monotonic() + timeout_s
    for handle, method in pings:
        while True:
            try:
                remaining = max(1.0, deadline - time.monotonic())
                ray.get(getattr(handle, method.__name__).remote(), timeout=remaining)
                break
            except (*ACTOR_LOSS, GetTimeoutError) as error:
                if time.monotonic() > deadline:
                    raise StageFailed(
                        f"an actor did not come back within {timeout_s:.0f} s: {error}"
                    ) from error
                time.sleep(0.5)
