"""The fault bookkeeping of `satseq.cluster.faults`: retry bounds, which kind of actor died, and
an actor Ray restarted between two calls found out by its incarnation (a real Ray actor)."""

import os
import time

import pytest
import ray
from ray.exceptions import RayActorError

from satseq.actors.rollout import RolloutActor
from satseq.cluster.faults import (
    ACTOR_LOSS,
    RESTARTED_ACTOR,
    ActorRestarted,
    FaultLog,
    StageFailed,
    actor_roles,
    check_not_restarted,
    fault_kind,
    incarnations,
)


def test_a_stage_fails_past_its_retries_naming_what_died():
    faults = FaultLog(max_retries=2)
    faults.record("rollout", 3, RuntimeError("a"))
    faults.record("learner", 3, RuntimeError("b"))
    assert faults.stage_metrics()["faults/rollout"] == 1
    with pytest.raises(StageFailed, match=r"stage 3 failed 3 times .*learner 2×, rollout 1×"):
        faults.record("learner", 3, RuntimeError("c"))
    faults.next_stage()
    assert faults.stage_metrics()["faults/learner"] == 0 and faults.total == 3


def test_only_an_actor_whose_process_changed_counts_as_restarted():
    before = {"a": "p1", "b": "p2", "swapped-out": "p3"}
    check_not_restarted(before, {"a": "p1", "b": "p2", "swapped-in": "p9"})  # a swap: no fault
    with pytest.raises(ActorRestarted, match="actor b was restarted") as caught:
        check_not_restarted(before, {"a": "p1", "b": "p4"})
    assert isinstance(caught.value, ACTOR_LOSS)  # the coordinator retries the stage
    assert fault_kind(caught.value, {"b": "learner"}) == "learner"
    assert fault_kind(caught.value, {}) == "node"


def test_an_actor_killed_between_calls_answers_again_from_a_new_process(
    ray_cluster, raw_tiny_model
):
    """Ray restarts it and queues the next call for the new process, so no call fails: only its
    incarnation says it lost its state."""
    actor = RolloutActor.options(num_cpus=0, **RESTARTED_ACTOR).remote({"a": raw_tiny_model})
    try:
        ray.get(actor.ready.remote(), timeout=120)
        before = incarnations([actor])
        assert before == incarnations([actor])  # asked twice, same process
        pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
        os.kill(pid, 9)
        deadline = time.monotonic() + 120
        while True:  # the kill lands between calls; a ping may still meet the dying process
            try:
                now = incarnations([actor])
                break
            except RayActorError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        roles = actor_roles(rollout=[actor])
        with pytest.raises(ActorRestarted) as caught:
            check_not_restarted(before, now)
        assert fault_kind(caught.value, roles) == "rollout"
    finally:
        ray.kill(actor, no_restart=True)
