"""Agent replicas killed (SIGKILL, real processes of this test's Ray instance): /predict answers
from the other agents meanwhile (`degraded: true`), never a 5xx, and once Ray Serve has
replaced the replica the whole team answers again.

A replica can die holding calls (the ingress gets ActorDiedError) or between calls (the router
holds the next ones without an error, and the ingress learns it from Serve's controller); under
load either can happen, so a test makes the latter certain. An agent with a second replica
loses nothing: the calls the dead replica held are sent again, to the other one.
"""

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Callable

import httpx
import pytest
import ray

from satseq.serving.app import AGENT_PREFIX
from tests.serving.load import (
    Reply,
    failures,
    metric_samples,
    percentile,
    predict,
    run_clients,
    summary,
)
from tests.serving.replicas import REPLICAS, RESILIENT_APP, TEAM, replica_pids

pytestmark = pytest.mark.slow
CLIENTS = 32
BEFORE_KILL_S = 3.0  # whole-team traffic first
AFTER_SETTLED_S = 2.0  # and on, once the team is whole again
SECOND_REPLICA_LOAD_S = 6.0  # load after killing one of two replicas
RECOVERY_LIMIT_S = 120.0
POLL_S = 0.05


def kill_replica(agent: str) -> tuple[int, float]:
    """SIGKILL a replica of `agent`; (its pid, when)."""
    pid = replica_pids(RESILIENT_APP, AGENT_PREFIX + agent)[0]
    os.kill(pid, signal.SIGKILL)
    return pid, time.monotonic()


def await_replaced(agent: str, killed_pid: int) -> float:
    """Wait (bounded) until the agent has its REPLICAS again, none the killed one; when."""
    deadline = time.monotonic() + RECOVERY_LIMIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(ray.exceptions.RayError):  # a replica starting or stopping
            pids = replica_pids(RESILIENT_APP, AGENT_PREFIX + agent)
            if len(pids) == REPLICAS[agent] and killed_pid not in pids:
                return time.monotonic()
        time.sleep(POLL_S)
    raise AssertionError(f"{agent} has not got its {REPLICAS[agent]} replicas back")


def assert_left_out(body: dict, agent: str) -> None:
    """A degraded answer of the team without `agent`."""
    assert body["degraded"] is True and set(body["failed_agents"]) == {agent}
    assert body["agents"] == [name for name in TEAM if name != agent]


def assert_health(server, up: dict[str, bool]) -> None:
    """/health and the satseq_agent_up gauges say which agents are up."""
    health = httpx.get(server.url + "/health", timeout=30)
    assert health.status_code == (200 if all(up.values()) else 503)
    assert health.json()["agents"] == up
    samples = metric_samples(server)
    assert {name: samples[f'satseq_agent_up{{agent="{name}"}}'] == 1 for name in up} == up


def first_whole_team_reply(replies: list[Reply], killed: float) -> Reply | None:
    """The first reply, to a request sent after the kill, that every agent answered."""
    whole = [r for r in replies if r.sent > killed and r.body and not r.degraded]
    return min(whole, key=lambda r: r.received, default=None)


async def kill_under_load(
    server, victim: str, replies: list[Reply], settled: Callable[[float], bool]
) -> tuple[int, float]:
    """CLIENTS clients; a replica of `victim` killed after BEFORE_KILL_S; the load goes on until
    `settled(kill time)`, then AFTER_SETTLED_S more. (killed pid, kill time)."""
    stopped = False

    async def kill_and_settle() -> tuple[int, float]:
        nonlocal stopped
        try:
            await asyncio.sleep(BEFORE_KILL_S)
            pid, killed = kill_replica(victim)
            while not settled(killed):
                assert time.monotonic() - killed < RECOVERY_LIMIT_S, "the team did not recover"
                await asyncio.sleep(POLL_S)
            await asyncio.sleep(AFTER_SETTLED_S)
            return pid, killed
        finally:
            stopped = True

    killing = asyncio.ensure_future(kill_and_settle())
    await run_clients(server, CLIENTS, lambda: stopped, replies)
    return await killing


def failure_reasons(replies: list[Reply], agent: str) -> dict[str, int]:
    """How many degraded replies left `agent` out, by the error's type."""
    return dict(
        Counter(r.body["failed_agents"][agent].split(":")[0] for r in replies if r.degraded)
    )


def test_a_replica_killed_under_load_is_replaced_while_the_others_answer(resilient_server):
    victim = "a1"
    replies: list[Reply] = []

    def recovered(killed: float) -> bool:
        return first_whole_team_reply(replies, killed) is not None

    started = time.monotonic()
    pid, killed = asyncio.run(kill_under_load(resilient_server, victim, replies, recovered))
    elapsed = time.monotonic() - started
    recovery = first_whole_team_reply(replies, killed)

    assert not failures(replies), failures(replies)[:3]  # every request: 200, never a 5xx
    assert {r.client for r in replies} == set(range(CLIENTS))
    assert not any(r.degraded for r in replies if r.received < killed)
    outage = [r for r in replies if killed < r.sent and r.received < recovery.received]
    assert outage, "no request was answered while the replica was down"
    for reply in outage:
        assert_left_out(reply.body, victim)
    assert all(set(r.body["failed_agents"]) == {victim} for r in replies if r.degraded)
    after = [r for r in replies if r.sent > recovery.received]
    assert after and not any(r.degraded for r in after)
    await_replaced(victim, pid)
    final = predict(resilient_server, "Compute 2 + 2.")
    assert final.status_code == 200 and final.json()["agents"] == list(TEAM)

    seconds = [r.seconds for r in outage]
    print(
        f"\n{summary(replies, CLIENTS, elapsed)}\n"
        f"replica {pid} of {victim} killed; recovery (kill → first whole-team answer): "
        f"{recovery.received - killed:.2f} s\n"
        f"{sum(r.degraded for r in replies)} degraded replies "
        f"{failure_reasons(replies, victim)}; {len(outage)} requests during the outage: p50 "
        f"{percentile(seconds, 0.5) * 1000:.0f} ms, p99 {percentile(seconds, 0.99) * 1000:.0f} ms"
    )


def test_a_replica_killed_between_requests_is_found_down_and_left_out(resilient_server):
    victim = "a2"
    pid, killed = kill_replica(victim)
    first = predict(resilient_server, "Compute 5 + 6.")
    answered = time.monotonic()
    assert first.status_code == 200, first.text
    assert_left_out(first.json(), victim)
    assert "UNHEALTHY" in first.json()["failed_agents"][victim]  # Serve's controller said so
    assert_health(resilient_server, {name: name != victim for name in TEAM})
    while True:
        reply = predict(resilient_server, "Compute 5 + 6.")
        assert reply.status_code == 200, reply.text
        if not reply.json()["degraded"]:
            break
        assert_left_out(reply.json(), victim)
        assert time.monotonic() - killed < RECOVERY_LIMIT_S, "the team did not recover"
        time.sleep(POLL_S)
    recovered = time.monotonic()
    assert reply.json()["agents"] == list(TEAM)
    assert_health(resilient_server, dict.fromkeys(TEAM, True))
    await_replaced(victim, pid)
    print(
        f"\nreplica {pid} of {victim} killed between requests: the next answered without it "
        f"in {answered - killed:.2f} s; recovery {recovered - killed:.2f} s"
    )


def test_a_replica_killed_beside_a_second_one_costs_no_answer(resilient_server):
    victim = "a0"
    assert REPLICAS[victim] == 2
    replies: list[Reply] = []

    def observed(killed: float) -> bool:
        return time.monotonic() - killed > SECOND_REPLICA_LOAD_S

    pid, killed = asyncio.run(kill_under_load(resilient_server, victim, replies, observed))
    assert not failures(replies), failures(replies)[:3]
    after_kill = [r for r in replies if r.received > killed]
    assert after_kill and not [r.body for r in after_kill if r.degraded]
    replaced = await_replaced(victim, pid)
    print(
        f"\nreplica {pid} of {victim} (one of {REPLICAS[victim]}) killed under load: "
        f"{len(after_kill)} replies after the kill, none degraded; Serve replaced it in "
        f"{replaced - killed:.2f} s"
    )
