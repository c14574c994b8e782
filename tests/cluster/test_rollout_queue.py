"""The overlapped stage's scheduler (`RolloutQueue`) with real threads and a recording team:
which weights version generates which stage, when pushes reach the engines, the staleness
bound, and the queue as a stage's state."""

import threading
import time

import pytest

from satseq.actors.trajectory import Trajectory
from satseq.cluster.rollout_queue import RolloutQueue


class RecordingTeam:
    """Engines whose weights have a version, pushes that move it, and a log of both (the order
    the engines saw them in)."""

    def __init__(self, generate_seconds: float = 0.0):
        self.engine_version = 0
        self.log: list[str] = []
        self.deferred: set[int] | None = None
        self.generate_seconds = generate_seconds
        self.lock = threading.Lock()

    def generate(self, stage: int) -> list[Trajectory]:
        time.sleep(self.generate_seconds)
        with self.lock:
            self.log.append(f"generate {stage} on v{self.engine_version}")
        trajectory = Trajectory(
            stage, [1], [2], [1], [0], "stop", meta={"seen": self.engine_version}
        )
        return [trajectory], {}

    def push(self, agent: int) -> None:
        if self.deferred is not None:
            self.deferred.add(agent)
            return
        with self.lock:
            self.engine_version += agent == 0  # one version per stage: agent 0's push counts it
            self.log.append(f"push a{agent}")

    def defer(self) -> None:
        self.deferred = set() if self.deferred is None else self.deferred

    def flush(self) -> None:
        agents, self.deferred = sorted(self.deferred or ()), None
        for agent in agents:
            self.push(agent)


def queue_of(team: RecordingTeam, K: int) -> RolloutQueue:
    return RolloutQueue(K, plan=lambda s: s, generate=team.generate, pushes=team, agents=["a0"])


def run_stages(queue: RolloutQueue, team: RecordingTeam, stages: int) -> list:
    taken = []
    for stage in range(stages):
        rollouts = queue.take(stage, stages - 1)
        taken.append(rollouts)
        team.push(1)  # the stage's updates, each pushed
        team.push(0)
        queue.boundary()
    queue.close()
    return taken


def test_the_synchronous_stage_generates_its_own_rollouts_on_its_own_weights():
    team = RecordingTeam()
    taken = run_stages(queue_of(team, 0), team, 3)
    assert [(r.stage, r.version, r.staleness) for r in taken] == [(0, 0, 0), (1, 1, 0), (2, 2, 0)]
    assert team.log == [
        "generate 0 on v0", "push a1", "push a0",
        "generate 1 on v1", "push a1", "push a0",
        "generate 2 on v2", "push a1", "push a0",
    ]  # fmt: skip


def test_one_stage_ahead_the_next_rollouts_are_generated_during_the_updates():
    """K = 1: stage s + 1 is generated on version s while stage s updates; the pushes wait for
    the boundary, after that generation, in team order."""
    team = RecordingTeam(generate_seconds=0.05)
    taken = run_stages(queue_of(team, 1), team, 4)
    assert [(r.stage, r.version) for r in taken] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert [r.trajectories[0].meta["seen"] for r in taken] == [0, 0, 1, 2]
    assert [r.trajectories[0].meta["policy_version"] for r in taken] == [
        {"a0": 0}, {"a0": 0}, {"a0": 1}, {"a0": 2},
    ]  # fmt: skip
    assert team.log == [
        "generate 0 on v0",  # stage 0 has nothing queued: it generates its own
        "generate 1 on v0", "push a0", "push a1",
        "generate 2 on v1", "push a0", "push a1",
        "generate 3 on v2", "push a0", "push a1",
        "push a0", "push a1",  # the last stage generates nothing ahead
    ]  # fmt: skip


def test_the_generation_ahead_overlaps_the_stage_and_counts_as_engine_time():
    team = RecordingTeam(generate_seconds=0.3)
    queue = queue_of(team, 1)
    queue.take(0, 3)
    queue.boundary()
    started = time.perf_counter()
    queue.take(1, 3)  # stage 1's rollouts were generated during stage 0: nothing to wait for
    time.sleep(0.3)  # the learners, while stage 2 is generated
    queue.boundary()
    assert time.perf_counter() - started < 0.55  # not 0.3 + 0.3: the two overlapped
    assert queue.engine_seconds == pytest.approx(0.3, abs=0.1)
    queue.close()


def test_rollouts_past_the_bound_are_dropped_counted_and_generated_afresh():
    team = RecordingTeam()
    queue = queue_of(team, 2)
    queue.take(0, 9)  # generates 0, queues 1 and 2 on v0
    queue.boundary()
    state = queue.state_dict()
    resumed = queue_of(team, 1)  # a resume with a smaller bound
    resumed.load_state_dict(state)
    resumed.take(1, 9)
    resumed.boundary()
    rollouts = resumed.take(2, 9)  # queued on v0: two versions old
    assert resumed.dropped == 1 and rollouts.version == 2 and rollouts.staleness == 0
    resumed.close()


def test_the_queue_is_a_stages_state_once_complete():
    team = RecordingTeam(generate_seconds=0.05)
    queue = queue_of(team, 1)
    queue.take(0, 5)
    with pytest.raises(RuntimeError, match="boundary"):
        queue.state_dict()  # stage 1 may still be generating
    queue.boundary()
    state = queue.state_dict()
    restored = queue_of(RecordingTeam(), 1)
    restored.load_state_dict(state)
    rollouts = restored.take(1, 5)
    assert (rollouts.version, rollouts.trajectories[0].meta["seen"]) == (0, 0)
    queue.close()
    restored.close()


def test_a_failed_generation_ahead_is_raised_at_the_boundary():
    def generate(stage):
        if stage == 1:
            raise RuntimeError("the rollout actor died")
        return [], {}

    queue = RolloutQueue(1, lambda s: s, generate, RecordingTeam(), ["a0"])
    queue.take(0, 5)
    with pytest.raises(RuntimeError, match="died"):
        queue.boundary()
    queue.close()
