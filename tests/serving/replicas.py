"""The served test team's replicas as processes: which pid serves a deployment, and its memory.

A pid is only handed out after checking that the process descends from this test process,
i.e. belongs to the Ray instance the test session started, so that tests kill and measure
nothing else.
"""

from __future__ import annotations

import os

import psutil
import ray

from satseq.serving.app import AGENT_PREFIX, INGRESS

TEAM = ("a0", "a1", "a2")
RESILIENT_APP = "resilient"
REPLICAS = {"a0": 2, "a1": 1, "a2": 1}  # of each agent in RESILIENT_APP
SERVE_NAMESPACE = "serve"
REPLICA_ACTOR_PREFIX = "SERVE_REPLICA::"  # + app#deployment#replica (Serve's ReplicaID)
PID_TIMEOUT_S = 60.0


def started_by_this_test(pid: int) -> bool:
    """Whether `pid` descends from this process (Ray's raylet starts its workers)."""
    return any(parent.pid == os.getpid() for parent in psutil.Process(pid).parents())


def replica_pids(app: str, deployment: str) -> list[int]:
    """The pids of `deployment`'s live replicas in application `app`."""
    prefix = f"{REPLICA_ACTOR_PREFIX}{app}#{deployment}#"
    names = [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].startswith(prefix)
    ]
    pids = [
        ray.get(
            # a lambda travels by value: the replica imports nothing of the tests
            ray.get_actor(name, namespace=SERVE_NAMESPACE).__ray_call__.remote(
                lambda _replica: os.getpid()
            ),
            timeout=PID_TIMEOUT_S,
        )
        for name in names
    ]
    foreign = [pid for pid in pids if not started_by_this_test(pid)]
    assert not foreign, f"replicas {foreign} of {app}/{deployment} are not this test's processes"
    return pids


def serving_pids(app: str) -> dict[str, int]:
    """'deployment#k' → pid of its k-th replica, for the ingress and every agent of TEAM."""
    deployments = [INGRESS, *(AGENT_PREFIX + name for name in TEAM)]
    return {
        f"{deployment}#{k}": pid
        for deployment in deployments
        for k, pid in enumerate(replica_pids(app, deployment))
    }


def rss_bytes(pids: dict[str, int]) -> dict[str, int]:
    """Name → resident memory of its process now."""
    return {name: psutil.Process(pid).memory_info().rss for name, pid in pids.items()}
