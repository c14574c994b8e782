"""Rollouts generated ahead of their stage, with bounded staleness (`rollout.max_staleness`,
design §12 "Overlapped stages").

With K = 0 a stage generates its own rollouts, then its learners update: the synchronous stage.
With K ≥ 1 the rollouts of stage s + K are generated while stage s's learners update, by one
producer thread that runs its jobs in the order they are given:

    stage s:   take(s) ─ submit(generate s+K) ─ learners: log-probs, updates ─ boundary()
    producer:            [generate s+K on the weights of version s] ────────── [push weights]

The weight pushes of stage s's updates are deferred to its boundary, where the producer makes
them after the generation it is running: the engines change weights only between two
generations, at a version boundary, never under a half-updated team. Generation for stage t thus
runs on the weights of version t − K (those stage t − K started with), and each trajectory
records that version per agent (`meta["policy_version"]`). A stage never trains on rollouts more
than K versions old: older ones (after a resume with a smaller K, say) are dropped, counted, and
generated afresh.

The queue is part of the stage's state: a boundary waits until the queued rollouts are complete,
so a checkpoint holds them, and a retried or resumed stage trains on exactly the rollouts the
uninterrupted run would have (generation order and seeds included).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from satseq.actors.trajectory import Trajectory

Plan = Any
"""What a recipe decided a stage's rollouts are (prompts, owners, sampling spec): made in the
stage's own thread, so the recipe's state (cursor, trackers) moves deterministically."""


class DeferrablePushes(Protocol):
    """The weight sync as the queue drives it (`satseq.cluster.weight_sync.WeightSync`)."""

    def defer(self) -> None: ...

    def flush(self) -> None: ...


@dataclass
class StageRollouts:
    """A stage's planned rollouts, the version of the weights that generated them, the seconds
    the engines spent generating them, and what the generation reports (its metrics)."""

    stage: int
    version: int
    plan: Plan
    trajectories: list[Trajectory] = field(default_factory=list)
    seconds: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def staleness(self) -> int:
        return self.stage - self.version


class RolloutQueue:
    """Plans and generates each stage's rollouts up to `max_staleness` stages ahead: plan(stage)
    runs in the stage's thread, generate(plan) → (trajectories, metrics) in the producer's
    (K ≥ 1)."""

    def __init__(
        self,
        max_staleness: int,
        plan: Callable[[int], Plan],
        generate: Callable[[Plan], tuple[list[Trajectory], dict[str, float]]],
        pushes: DeferrablePushes,
        agents: list[str],
    ):
        self.max_staleness = max_staleness
        self.plan = plan
        self.generate = generate
        self.pushes = pushes
        self.agents = agents
        self.queued: dict[int, StageRollouts] = {}
        self.pending: dict[int, Future] = {}
        self.dropped = 0
        """Trajectories of the last stage taken that were past the bound (never trained on)."""
        self.engine_seconds = 0.0
        """Generation done during the stage now running (its own, and the stages' ahead)."""
        self._producer: ThreadPoolExecutor | None = None

    def take(self, stage: int, last_stage: int) -> StageRollouts:
        """Stage `stage`'s rollouts: generated now (K = 0, or none fresh enough is queued), or
        taken from the queue; then the stages up to stage + K (not past `last_stage`) are
        planned and handed to the producer, and weight pushes wait for the boundary."""
        self.dropped, self.engine_seconds = 0, 0.0
        self._wait(stage)
        rollouts = self.queued.pop(stage, None)
        if rollouts is not None and rollouts.staleness > self.max_staleness:
            self.dropped = len(rollouts.trajectories)  # never trained on silently
            rollouts = None
        if rollouts is None:
            rollouts = self._produce(StageRollouts(stage, stage, self.plan(stage)))
            self.engine_seconds += rollouts.seconds
        for ahead in range(stage + 1, min(stage + self.max_staleness, last_stage) + 1):
            if ahead not in self.queued:
                self._submit(StageRollouts(ahead, stage, self.plan(ahead)))
        if self.max_staleness > 0:
            self.pushes.defer()
        return rollouts

    def boundary(self) -> None:
        """The end of a stage: the deferred weight pushes go to the engines after the
        generation in flight (the version boundary), and the queue completes, so that the
        checkpoint written next holds it."""
        if self.max_staleness > 0:
            self._in_producer(self.pushes.flush).result()
        for stage in list(self.pending):
            self._wait(stage)

    def close(self) -> None:
        """Stop the producer, its job in flight finished whatever its outcome, and forget the
        queue (a retried stage restores it from its checkpoint)."""
        if self._producer is not None:
            self._producer.shutdown(wait=True, cancel_futures=True)
        self._producer = None
        self.pending.clear()
        self.queued.clear()

    def _produce(self, rollouts: StageRollouts) -> StageRollouts:
        started = time.perf_counter()
        rollouts.trajectories, rollouts.metrics = self.generate(rollouts.plan)
        rollouts.seconds = time.perf_counter() - started
        for t in rollouts.trajectories:
            t.meta["policy_version"] = dict.fromkeys(self.agents, rollouts.version)
        return rollouts

    def _submit(self, rollouts: StageRollouts) -> None:
        self.queued[rollouts.stage] = rollouts
        self.pending[rollouts.stage] = self._in_producer(self._produce, rollouts)

    def _in_producer(self, job: Callable, *args: Any) -> Future:
        if self._producer is None:
            self._producer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollouts")
        return self._producer.submit(job, *args)

    def _wait(self, stage: int) -> None:
        """Until stage `stage`'s queued rollouts are generated; the producer's error (an actor's
        loss) is raised here."""
        future = self.pending.pop(stage, None)
        if future is not None:
            self.engine_seconds += future.result().seconds

    def state_dict(self) -> dict[str, Any]:
        """The queue, complete (after `boundary`)."""
        if self.pending:
            raise RuntimeError("the rollout queue is still generating: call boundary() first")
        return {"queued": dict(self.queued)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        self.queued = dict(state["queued"])
