"""32 clients at once for a bounded time: every request gets its answer, none fails."""

import asyncio
import time

import pytest

from tests.serving.conftest import TEAM
from tests.serving.load import failures, run_clients, summary

pytestmark = pytest.mark.slow
CLIENTS = 32
DURATION_S = 10.0


def test_32_concurrent_clients_get_every_answer(server):
    replies = []
    started = time.monotonic()
    deadline = started + DURATION_S
    asyncio.run(run_clients(server, CLIENTS, lambda: time.monotonic() > deadline, replies))
    elapsed = time.monotonic() - started
    assert not failures(replies), failures(replies)[:3]
    assert {r.client for r in replies} == set(range(CLIENTS))  # every client was answered
    for reply in replies:
        assert reply.body["degraded"] is False and reply.body["agents"] == list(TEAM)
    print("\n" + summary(replies, CLIENTS, elapsed))
