"""The fault bookkeeping of `satseq.cluster.faults`: retry bounds, which kind of actor died, and
which incarnations (`satseq.actors.incarnation`) say an actor was restarted (real restarts:
`test_train_faults.py`)."""

import pytest

from satseq.actors.incarnation import ActorRestarted, check_not_restarted
from satseq.cluster.faults import ACTOR_LOSS, FaultLog, StageFailed, fault_kind


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
