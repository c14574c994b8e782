"""Dynamic batching: requests that reach an agent together share its engine calls, and each one
gets its own answers, sampled with its own parameters; a bad request among them gets its 4xx.

The server tests send real requests to the package's served team; the batcher's own tests run
it on a plain function in a real event loop and thread.
"""

import asyncio
import threading

import httpx
import pytest

from satseq.serving.batching import EngineBatcher
from tests.serving.conftest import TEAM
from tests.serving.load import REQUEST_TIMEOUT_S, metric_samples

# (temperature, max_tokens, samples_per_agent): two greedy and two sampled settings, each
# for PER_SETTING problems sent at once, so that engine calls see several requests of a kind.
SETTINGS = [(0.0, 24, 1), (0.0, 6, 2), (0.9, 24, 3), (0.9, 6, 1)]
PER_SETTING = 4


def request(k: int, temperature: float, max_tokens: int, n: int) -> dict:
    # the tiny model's responses echo the numbers, e.g. "3+19=22. \\boxed{22}"
    return {
        "problem": f"Compute {k} + {10 + 3 * k}.",
        "temperature": temperature,
        "max_tokens": max_tokens,
        "samples_per_agent": n,
        "return_trajectories": True,
    }


async def post_all(server, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers, timeout=REQUEST_TIMEOUT_S
    ) as http:
        return await asyncio.gather(*(http.post("/predict", json=body) for body in bodies))


def responses(body: dict) -> dict[str, list[str]]:
    """Agent → its samples' response texts."""
    return {
        agent: [sample["response"] for sample in samples]
        for agent, samples in body["trajectories"].items()
    }


def batched_requests(server) -> tuple[float, float]:
    """(sum of the engine-call sizes of every agent answer so far, number of those answers)."""
    samples = metric_samples(server)
    total = sum(samples[f'satseq_agent_batch_size_sum{{agent="{a}"}}'] for a in TEAM)
    count = sum(samples[f'satseq_agent_batch_size_count{{agent="{a}"}}'] for a in TEAM)
    return total, count


@pytest.mark.slow
def test_concurrent_requests_are_batched_and_each_gets_its_own_answers(server):
    bodies = [
        request(len(SETTINGS) * i + s, *setting)
        for i in range(PER_SETTING)
        for s, setting in enumerate(SETTINGS)
    ]
    greedy = [i for i, body in enumerate(bodies) if body["temperature"] == 0]
    # each greedy request alone first: its engine call answers it and nothing else
    alone = {i: asyncio.run(post_all(server, [bodies[i]]))[0].json() for i in greedy}
    assert len({str(responses(body)) for body in alone.values()}) == len(greedy)

    total_before, count_before = batched_requests(server)
    replies = asyncio.run(post_all(server, bodies))
    total_after, count_after = batched_requests(server)

    for i, (body, reply) in enumerate(zip(bodies, replies, strict=True)):
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        n = body["samples_per_agent"]
        assert answer["agents"] == list(TEAM) and not answer["degraded"]
        assert all(len(answer["individual_answers"][agent]) == n for agent in TEAM)
        assert all(len(texts) == n for texts in responses(answer).values())
        if i in greedy:  # the same text as when it was alone, so its own, at its max_tokens
            assert responses(answer) == responses(alone[i])
            if body["max_tokens"] == 6:  # too few tokens for the tiny model to finish
                finish = {s["finish_reason"] for t in answer["trajectories"].values() for s in t}
                assert finish == {"length"}
    # some engine calls answered several of these requests at once
    assert count_after - count_before == len(bodies) * len(TEAM)
    assert total_after - total_before > count_after - count_before


@pytest.mark.slow
def test_bad_requests_among_good_ones_get_4xx_with_a_message(server):
    good = [request(k, 0.0, 8, 1) for k in range(6)]
    bad = [
        {"problem": "Compute " + "1" * 2000, "max_tokens": 256},  # over the context: 413
        {"problem": "Compute 1 + 1.", "samples_per_agent": 0},  # out of bounds: 422
        {"problem": "Compute 1 + 1.", "temperature": "hot"},  # wrong type: 422
    ]
    replies = asyncio.run(post_all(server, good[:3] + bad + good[3:]))
    statuses = [reply.status_code for reply in replies]
    assert statuses == [200] * 3 + [413, 422, 422] + [200] * 3
    for reply in replies[3:6]:
        assert reply.json()["detail"]  # says what is wrong


def hold_first_batch(release: threading.Event, batches: list[list[int]]):
    """A batch function that records its batches, waits for `release` on the first, and
    doubles each request; -1 is a request it cannot answer."""

    def answer(requests: list[int]) -> list[int]:
        batches.append(list(requests))
        if len(batches) == 1:
            release.wait(10)
        if -1 in requests:
            raise ValueError("cannot answer -1")
        return [2 * r for r in requests]

    return answer


def test_requests_queued_during_an_engine_call_share_the_next():
    async def scenario():
        release, batches = threading.Event(), []
        batcher = EngineBatcher(hold_first_batch(release, batches), max_batch_size=3)
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0.05)  # the first call runs, alone
        queued = [asyncio.ensure_future(batcher.submit(r)) for r in (2, 3, 4, 5)]
        await asyncio.sleep(0.05)
        release.set()
        return await asyncio.gather(first, *queued), batches

    results, batches = asyncio.run(scenario())
    assert results == [2, 4, 6, 8, 10]
    assert batches == [[1], [2, 3, 4], [5]]  # at most max_batch_size a call


def test_an_error_reaches_only_the_request_it_is_about():
    async def scenario():
        release, batches = threading.Event(), []
        batcher = EngineBatcher(hold_first_batch(release, batches), max_batch_size=8)
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0.05)
        queued = [asyncio.ensure_future(batcher.submit(r)) for r in (2, -1, 3)]
        cancelled = asyncio.ensure_future(batcher.submit(4))
        await asyncio.sleep(0.05)
        cancelled.cancel()  # its caller gives up while it queues
        release.set()
        return await asyncio.gather(first, *queued, return_exceptions=True), batches

    results, batches = asyncio.run(scenario())
    assert results[:2] == [2, 4] and results[3] == 6
    assert isinstance(results[2], ValueError) and "-1" in str(results[2])
    assert batches == [[1], [2, -1, 3], [2], [-1], [3]]  # the failed batch, then one by one
