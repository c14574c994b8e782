"""`AgentLiveness` on an event loop, against a stand-in for one agent's deployment handle whose
replicas are scripted (test_faults.py kills real replicas under real load)."""

import asyncio

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge
from ray.exceptions import RayActorError

from satseq.serving.liveness import (
    GRACE_LATENCIES,
    MAX_GRACE_S,
    MIN_GRACE_S,
    RECENT_ANSWERS,
    AgentLiveness,
    grace_s,
)


class BusyAgent:
    """A deployment handle whose `ready` probe never answers (it waits in the queue of a
    replica busy with calls) while its calls answer as `send` scripts them."""

    app_name, deployment_name = "satseq", "agent_a0"

    def __init__(self) -> None:
        self.ready = self  # handle.ready.remote()
        self.probes = 0

    def remote(self) -> asyncio.Future:
        self.probes += 1
        return asyncio.get_running_loop().create_future()  # never answered


def reply(value=None, error: BaseException | None = None, after_s: float = 0.0):
    """A `send` for AgentLiveness.call: a response that ends after `after_s` seconds."""

    def send() -> asyncio.Future:
        response = asyncio.get_running_loop().create_future()

        def end() -> None:
            if not response.done():
                response.set_exception(error) if error else response.set_result(value)

        asyncio.get_running_loop().call_later(after_s, end)
        return response

    return send


def liveness(handle) -> AgentLiveness:
    return AgentLiveness("a0", handle, Gauge("up", "up", registry=CollectorRegistry()))


def up(agent: AgentLiveness) -> float:
    """The agent's `up` gauge, as Prometheus reads it."""
    return agent.up_gauge.collect()[0].samples[0].value


def test_an_answer_from_another_replica_keeps_the_agent_up_while_its_probe_waits():
    """One call loses its replica; another replica answers a second call while the probe waits
    behind it: the lost call is sent again and answered, and the agent never goes down."""

    async def scenario():
        handle = BusyAgent()
        agent = liveness(handle)
        sends = iter([reply(error=RayActorError()), reply("again")])
        lost = asyncio.ensure_future(agent.call(lambda: next(sends)()))
        await asyncio.sleep(0.05)  # the lost call has the agent probed
        assert agent.is_probed and handle.probes == 1
        assert await agent.call(reply("answer", after_s=0.1)) == "answer"
        assert not agent.is_probed  # the answer brought it up
        assert await lost == "again"
        await asyncio.sleep(MIN_GRACE_S + 0.2)  # past the grace a silent probe would have had
        return agent

    agent = asyncio.run(scenario())
    assert not agent.is_down
    assert up(agent) == 1


def test_without_an_answer_the_agent_goes_down_after_the_grace():
    """The same lost call with nothing answering after it: the agent is down, the call fails."""

    async def scenario():
        agent = liveness(BusyAgent())
        lost = asyncio.ensure_future(agent.call(reply(error=RayActorError())))
        await asyncio.sleep(MIN_GRACE_S + 0.2)  # no answer yet: the least grace
        return agent, lost

    agent, lost = asyncio.run(scenario())
    assert agent.is_down
    assert isinstance(lost.exception(), RayActorError)
    assert up(agent) == 0


def test_a_slow_agent_has_a_grace_its_pace_needs():
    """An agent whose answers take 0.8 s (a loaded machine) loses a replica; the other replica's
    next answer comes 1.4 s later, past MIN_GRACE_S but within twice the agent's pace: the agent
    never goes down and the lost call is answered again."""

    async def scenario():
        handle = BusyAgent()
        agent = liveness(handle)
        assert await agent.call(reply("paced", after_s=0.8)) == "paced"
        survivor = asyncio.ensure_future(agent.call(reply("survivor", after_s=1.4)))
        sends = iter([reply(error=RayActorError()), reply("again")])
        lost = asyncio.ensure_future(agent.call(lambda: next(sends)()))
        await asyncio.sleep(MIN_GRACE_S + 0.1)
        assert agent.is_probed and not agent.is_down  # past the least grace, still waiting
        assert await survivor == "survivor"
        assert await lost == "again"
        return agent

    agent = asyncio.run(scenario())
    assert not agent.is_down and not agent.is_probed
    assert up(agent) == 1


@given(st.lists(st.floats(0, 1e3), max_size=2 * RECENT_ANSWERS))
def test_the_grace_is_twice_the_slowest_recent_answer_within_its_bounds(latencies):
    grace = grace_s(latencies)
    assert MIN_GRACE_S <= grace <= MAX_GRACE_S
    slowest = max(latencies, default=0.0)
    if MIN_GRACE_S < GRACE_LATENCIES * slowest < MAX_GRACE_S:
        assert grace == GRACE_LATENCIES * slowest
    assert grace_s([*latencies, slowest + 1.0]) >= grace  # a slower answer never shortens it
