"""32 clients at once for a bounded time: every request gets its answer, none fails."""

import asyncio
import time

import httpx
import pytest

pytestmark = pytest.mark.slow
CLIENTS = 32
DURATION_S = 10.0


async def client(server, index: int, deadline: float, log: list) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=300) as http:
        request = 0
        while request == 0 or time.monotonic() < deadline:
            problem = f"Compute {index} + {request}."
            started = time.monotonic()
            response = await http.post("/predict", json={"problem": problem, "max_tokens": 24})
            log.append((index, request, response, time.monotonic() - started))
            request += 1


def test_32_concurrent_clients_get_every_answer(server):
    log: list = []

    async def run():
        deadline = time.monotonic() + DURATION_S
        await asyncio.gather(*(client(server, i, deadline, log) for i in range(CLIENTS)))

    started = time.monotonic()
    asyncio.run(run())
    elapsed = time.monotonic() - started
    statuses = [response.status_code for _, _, response, _ in log]
    assert statuses == [200] * len(log), [r.text for *_, r, _ in log if r.status_code != 200][:3]
    assert {index for index, *_ in log} == set(range(CLIENTS))  # every client was answered
    for *_, response, _ in log:
        body = response.json()
        assert body["degraded"] is False and body["agents"] == ["a0", "a1", "a2"]
    latencies = sorted(seconds for *_, seconds in log)
    print(
        f"\n{len(log)} requests from {CLIENTS} clients in {elapsed:.1f} s: "
        f"{len(log) / elapsed:.1f} req/s, p50 {latencies[len(log) // 2] * 1000:.0f} ms, "
        f"p99 {latencies[min(len(log) - 1, int(len(log) * 0.99))] * 1000:.0f} ms"
    )
