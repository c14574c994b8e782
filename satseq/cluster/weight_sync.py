"""Weight sync: after agent i's update its learner's weights reach every rollout engine of agent
i (design §3 step 6, last line; §11), in buckets of `rollout.weight_sync_bucket_mb`, broadcast
by the learner over a collective (`satseq.actors.weight_transfer`), or through the object store.
A LoRA agent's adapter (a few MiB) always goes through the object store, as one bucket that the
engines install as a new adapter version (design §12).
"""

from __future__ import annotations

import time

from satseq.actors.calls import ActorCalls
from satseq.actors.learner import Learner
from satseq.actors.rollout import RolloutWorker
from satseq.actors.weight_transfer import TensorSpec, TransferEndpoint, update_info
from satseq.cluster.engine_sleep import EngineSleep
from satseq.cluster.faults import ACTOR_LOSS
from satseq.cluster.started_team import StartedTeam, SyncSettings
from satseq.models import is_adapter_dir


class WeightSync:
    """Pushes an agent's weights from its learner (`team.learners[i]`, which a swap replaces in
    place) to the rollout workers' engines, and keeps what a collective needs between pushes:
    each agent's manifest once its learner and the engines formed their group.

    Overlapped stages (`rollout.max_staleness` ≥ 1, `satseq.cluster.rollout_queue`): after
    `defer()` a push only records its agent, and `flush()` makes the recorded pushes, in team
    order, at the version boundary."""

    def __init__(
        self, team: StartedTeam, calls: ActorCalls, engines: EngineSleep, settings: SyncSettings
    ):
        self.team = team
        self.calls = calls
        self.engines = engines
        self.bucket_mb = settings.bucket_mb
        self.weight_transfer = settings.weight_transfer
        """The collective's backend of a collective weight sync; None: the object store."""
        self.manifests: dict[int, list[TensorSpec]] = {}
        """Agent i's weight manifest, once its learner and the engines formed their group."""
        self.seconds = 0.0
        self.deferred: set[int] | None = None
        """The agents whose pushes wait for `flush`; None: pushes are made at once."""

    def push(self, i: int) -> None:
        """Agent i's rollout engines get its learner's current weights (deferred: at `flush`)."""
        if self.deferred is not None:
            self.deferred.add(i)
        elif self.weight_transfer is not None and not is_adapter_dir(self.team.model_dirs[i]):
            self._broadcast(i)
        else:
            self._stream(i)

    def defer(self) -> None:
        """From now on a push waits for `flush`."""
        self.deferred = set() if self.deferred is None else self.deferred

    def flush(self) -> None:
        """The deferred pushes, in team order, each of its learner's weights as they are now;
        pushes are made at once again afterwards."""
        agents, self.deferred = sorted(self.deferred or ()), None
        for i in agents:
            self.push(i)

    def push_all(self) -> None:
        """Every agent's learner weights to the engines, at once (after a restore); pushes a
        failed stage deferred are part of it."""
        self.deferred = None
        for i in range(len(self.team.agents)):
            self.push(i)

    def forget(self, i: int | None = None) -> None:
        """The next push forms agent i's weight-transfer group again (every agent's when i is
        None: after an actor loss, a restarted actor is in no group)."""
        if i is None:
            self.manifests.clear()
        else:
            self.manifests.pop(i, None)

    def take_seconds(self) -> float:
        """Seconds spent moving weights to the engines since the last call."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def _broadcast(self, i: int) -> None:
        """The learner's rank 0 broadcasts, each engine receives: all in one round of calls.
        A failed round leaves no group trusted (the next push forms them again), and when an
        actor died it is that loss that is raised (the others' errors are its echo)."""
        calls = self.calls
        manifest = self.manifests.get(i) or self._open_transfer(i)
        info = update_info(manifest)
        pending = [
            calls.start(worker, RolloutWorker.receive_weights, self.team.agents[i], info)
            for worker in self.team.rollouts
        ]
        pending.append(calls.start(self.team.learners[i], Learner.send_weights, manifest))
        results, errors = [], []
        for call in pending:
            try:
                results += calls.wait([call])
            except Exception as error:
                errors.append(error)
        if errors:
            self.manifests.clear()
            raise next((e for e in errors if isinstance(e, ACTOR_LOSS)), errors[0])
        self.seconds += results[-1]

    def _open_transfer(self, i: int) -> list[TensorSpec]:
        """Agent i's learner (rank 0 at rank 0) and each rollout actor's engine for agent i (at
        ranks 1, 2, ...) form a group; returns the manifest of what the learner sends."""
        calls, learner = self.calls, self.team.learners[i]
        self.engines.set_awake(False)
        address = calls.wait([calls.start(learner, Learner.free_address)])[0]
        host, port = address.rsplit(":", 1)
        endpoint = TransferEndpoint(
            host,
            int(port),
            1 + len(self.team.rollouts),
            self.weight_transfer,
            int(self.bucket_mb * 2**20),
        )
        joins = [
            calls.start(
                worker,
                RolloutWorker.init_weight_transfer,
                self.team.agents[i],
                endpoint.worker_init_info(1 + j),
            )
            for j, worker in enumerate(self.team.rollouts)
        ]
        joins.append(calls.start(learner, Learner.open_weight_transfer, endpoint))
        calls.wait(joins)
        self.manifests[i] = calls.wait([calls.start(learner, Learner.weight_manifest)])[0]
        return self.manifests[i]

    def _stream(self, i: int) -> None:
        """Buckets (`Learner.weight_buckets`) through the object store: the learner gathers the
        next bucket while the engines load this one; no whole-model object exists, and on Ray
        no bucket passes through this process."""
        calls = self.calls
        self.engines.set_awake(False)
        loading: list = []
        started = None  # the first bucket: the learner's queued work (an update) is done
        buckets = calls.stream(self.team.learners[i], Learner.weight_buckets, self.bucket_mb)
        for bucket in buckets:
            started = started or time.perf_counter()
            calls.wait(loading)
            loading = [
                calls.start(worker, RolloutWorker.load_weights, self.team.agents[i], bucket)
                for worker in self.team.rollouts
            ]
        calls.wait(loading)
        self.seconds += time.perf_counter() - (started or time.perf_counter())
