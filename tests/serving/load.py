"""Load on the served team: concurrent HTTP clients posting /predict, and what each one got."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

REQUEST_TIMEOUT_S = 300.0
MAX_TOKENS = 24


@dataclass(frozen=True)
class Reply:
    """One /predict request: when it was sent and answered (monotonic s), and the answer."""

    client: int
    sent: float
    received: float
    status: int  # 0: no HTTP response (the connection failed)
    body: dict[str, Any] | None  # the JSON of a 200
    text: str

    @property
    def seconds(self) -> float:
        return self.received - self.sent

    @property
    def degraded(self) -> bool:
        return self.body is not None and self.body["degraded"]


def metric_samples(server) -> dict[str, float]:
    """The ingress's /metrics: 'name{labels}' → value."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def predict(server, problem: str) -> httpx.Response:
    """One /predict request, synchronously."""
    return httpx.post(
        server.url + "/predict",
        json={"problem": problem, "max_tokens": MAX_TOKENS},
        headers=server.headers,
        timeout=REQUEST_TIMEOUT_S,
    )


async def post_until(server, client: int, stop: Callable[[], bool], replies: list[Reply]) -> None:
    """One client: a request after the other, the first one whatever `stop()` says."""
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers, timeout=REQUEST_TIMEOUT_S
    ) as http:
        request = 0
        while request == 0 or not stop():
            problem = {"problem": f"Compute {client} + {request}.", "max_tokens": MAX_TOKENS}
            sent = time.monotonic()
            try:
                response = await http.post("/predict", json=problem)
                status, text = response.status_code, response.text
            except httpx.HTTPError as error:
                status, text = 0, f"{type(error).__name__}: {error}"
            body = response.json() if status == 200 else None
            replies.append(Reply(client, sent, time.monotonic(), status, body, text))
            request += 1


async def run_clients(server, clients: int, stop: Callable[[], bool], replies: list[Reply]) -> None:
    """`clients` clients at once until `stop()`; every reply is appended to `replies`."""
    await asyncio.gather(*(post_until(server, i, stop, replies) for i in range(clients)))


def failures(replies: Sequence[Reply]) -> list[str]:
    """The replies that are not 200, as 'status: text' (a few characters of each)."""
    return [f"{r.status}: {r.text[:300]}" for r in replies if r.status != 200]


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def summary(replies: Sequence[Reply], clients: int, elapsed: float) -> str:
    """'N requests from C clients in T s: R req/s, p50 … ms, p99 … ms'."""
    seconds = [r.seconds for r in replies]
    return (
        f"{len(replies)} requests from {clients} clients in {elapsed:.1f} s: "
        f"{len(replies) / elapsed:.1f} req/s, p50 {percentile(seconds, 0.5) * 1000:.0f} ms, "
        f"p99 {percentile(seconds, 0.99) * 1000:.0f} ms"
    )
