"""Soak: 50 clients on /predict for a minute. No request fails, and the serving processes (the
ingress and every agent replica) hold their memory: resident size grows under 10 % from the
end of a warm-up to the end of the load."""

import asyncio
import time

import pytest

from tests.serving.load import Reply, failures, run_clients, summary
from tests.serving.replicas import REPLICAS, RESILIENT_APP, rss_bytes, serving_pids

pytestmark = pytest.mark.slow
CLIENTS = 50
DURATION_S = 60.0
WARM_UP_S = 10.0
MAX_RSS_GROWTH = 0.10
MIB = 2**20


async def soak(server, pids: dict[str, int], replies: list[Reply]) -> dict[str, dict[str, int]]:
    """CLIENTS clients for DURATION_S; the processes' RSS after the warm-up and at the end."""
    started = time.monotonic()
    deadline = started + DURATION_S
    clients = asyncio.ensure_future(
        run_clients(server, CLIENTS, lambda: time.monotonic() > deadline, replies)
    )
    await asyncio.sleep(WARM_UP_S)
    rss = {"warm": rss_bytes(pids)}
    await asyncio.sleep(deadline - time.monotonic())
    rss["end"] = rss_bytes(pids)
    await clients
    return rss


def test_50_clients_for_a_minute_without_errors_or_memory_growth(resilient_server):
    pids = serving_pids(RESILIENT_APP)
    assert len(pids) == 1 + sum(REPLICAS.values())  # the ingress and every agent replica
    replies: list[Reply] = []
    started = time.monotonic()
    rss = asyncio.run(soak(resilient_server, pids, replies))
    elapsed = time.monotonic() - started

    growth = {name: rss["end"][name] / rss["warm"][name] - 1 for name in pids}
    print(f"\n{summary(replies, CLIENTS, elapsed)}")
    for name, pid in pids.items():
        print(
            f"{name} (pid {pid}): RSS {rss['warm'][name] / MIB:.0f} MiB after "
            f"{WARM_UP_S:g} s → {rss['end'][name] / MIB:.0f} MiB at the end "
            f"({growth[name]:+.1%})"
        )
    total_warm, total_end = sum(rss["warm"].values()), sum(rss["end"].values())
    total_growth = total_end / total_warm - 1
    print(f"all: {total_warm / MIB:.0f} → {total_end / MIB:.0f} MiB ({total_growth:+.1%})")
    assert not failures(replies), failures(replies)[:3]
    assert {r.client for r in replies} == set(range(CLIENTS))
    left_out = [r.body["failed_agents"] for r in replies if r.degraded]
    assert not left_out, f"{len(left_out)} answers left an agent out, the first: {left_out[:2]}"
    assert all(g < MAX_RSS_GROWTH for g in growth.values()), growth
