"""Which agents can answer: the ingress's view of its agent deployments when replicas die.

When an agent's replica dies (its process is killed, its node is lost), Ray Serve notices it
at the next health check and starts a replacement, which takes seconds: a new process loads
the model. Meanwhile Serve's router holds every new call to that agent until the replacement
is up. `AgentLiveness` marks the agent down instead, so that requests leave it out at once
(the others vote, `degraded: true`), until a probe gets an answer from it again.

A replica is suspected lost

- by a call that gets a lost-replica error (the calls the replica held when it died), or
- when a call has waited SUSPECT_AFTER_S, the agent has answered nothing for as long, and
  Serve's controller reports the deployment UNHEALTHY with no RUNNING replica (the replica
  died between calls: the router holds the new ones without an error).

Then the agent is probed (`ready`): if it answers within its grace (another replica took
over), nothing changes but that the calls which lost their replica are sent again, once;
otherwise the agent is down: the calls waiting on it are given up, and new ones skip it. An
answer to any call while it is probed counts as the probe's: a surviving replica under load
answers calls while the probe waits in its queue behind them. The grace follows the agent's
pace (`grace_s`): a surviving replica answers about as fast as the agent answered before, which
on a loaded machine is seconds, not milliseconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Gauge
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from ray.serve.schema import DeploymentStatus, ReplicaState

log = logging.getLogger(__name__)

# How long a suspected agent has to answer before it is down (a call that lost its replica
# waits as long to be sent again): GRACE_LATENCIES times the slowest of its last RECENT_ANSWERS
# answers, within [MIN_GRACE_S, MAX_GRACE_S]. Another replica answers at the agent's usual pace;
# a replacement takes a model load.
MIN_GRACE_S = 1.0
MAX_GRACE_S = 10.0
GRACE_LATENCIES = 2.0
RECENT_ANSWERS = 32
# A call pending this long, to an agent that answered nothing for as long, has the controller
# asked whether the agent lost every replica; at most once per CHECK_INTERVAL_S per agent.
SUSPECT_AFTER_S = 1.0
CHECK_INTERVAL_S = 1.0
# A probe waits this long for `ready` (the router holds it until a replica is up), then pauses
# PROBE_PAUSE_S and sends another.
PROBE_TIMEOUT_S = 5.0
PROBE_PAUSE_S = 0.2

REPLICA_LOST_ERRORS = (RayActorError, DeploymentUnavailableError, ReplicaUnavailableError)
"""What a call gets when its replica is gone, rather than failing on a live one: RayActorError
covers ActorDiedError (the process died) and ActorUnavailableError (it cannot be reached)."""


class AgentDown(Exception):
    """The agent is down: its replicas were lost, and it has not answered a probe since."""


def replica_lost(error: BaseException | None) -> bool:
    """Whether `error`, or an error it wraps, says the replica holding the call is gone."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, REPLICA_LOST_ERRORS):
            return True
        seen.add(id(error))
        error = getattr(error, "cause", None) or error.__cause__
    return False


def every_replica_lost(app: str, deployment: str) -> str | None:
    """Why Serve's controller reports `deployment` without a replica left (UNHEALTHY, none
    RUNNING), or None. Blocking: one call to the controller."""
    state = serve.status().applications[app].deployments[deployment]
    if state.status != DeploymentStatus.UNHEALTHY or state.replica_states.get(ReplicaState.RUNNING):
        return None
    return f"Serve reports it {state.status.value}, no replica running: {state.message}"


def grace_s(latencies: Iterable[float]) -> float:
    """How long an agent whose recent answers took `latencies` seconds has to answer once a
    replica is suspected lost."""
    slowest = max(latencies, default=0.0)
    return min(MAX_GRACE_S, max(MIN_GRACE_S, GRACE_LATENCIES * slowest))


async def awaited(response: Any) -> Any:
    """A DeploymentResponse as a coroutine, so asyncio can wait on and cancel it."""
    return await response


class AgentLiveness:
    """One agent as the ingress sees it: up; probed (a replica was suspected lost); or down
    (the probe got no answer within its grace) until the probe gets one.

    Used from the ingress replica's event loop only (its asyncio events are bound to it).
    """

    def __init__(self, name: str, handle: DeploymentHandle, up_gauge: Gauge) -> None:
        self.name = name
        self.handle = handle
        self.up_gauge = up_gauge
        self.down_reason: str | None = None
        self.down_since = 0.0
        self.up_since = 0.0  # monotonic time it last came back; 0: never went down
        self.answered_at = time.monotonic()  # its last answer
        self.latencies: deque[float] = deque(maxlen=RECENT_ANSWERS)  # of its last answers
        self._up = asyncio.Event()
        self._up.set()
        self._down = asyncio.Event()
        self._checked_at = 0.0
        self._background: set[asyncio.Task] = set()
        up_gauge.set(1)

    @property
    def is_down(self) -> bool:
        return self.down_reason is not None

    @property
    def is_probed(self) -> bool:
        """A replica was suspected lost and the agent has not answered a probe since."""
        return not self._up.is_set()

    def raise_if_down(self) -> None:
        if self.is_down:
            seconds = time.monotonic() - self.down_since
            raise AgentDown(
                f"agent {self.name!r} is down for {seconds:.1f} s ({self.down_reason}); "
                "Ray Serve is replacing its replica"
            )

    async def back_within(self, seconds: float) -> bool:
        """Whether the agent is up, or answers its probe within `seconds`."""
        try:
            await asyncio.wait_for(self._up.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def call(self, send: Callable[[], DeploymentResponse]) -> Any:
        """The result of the response `send()` returns, sent again once if its replica was lost
        and the agent is back within its grace. AgentDown: the agent is down."""
        try:
            return await self._call_once(send)
        except Exception as error:
            if not replica_lost(error) or not await self.back_within(grace_s(self.latencies)):
                raise
        return await self._call_once(send)

    async def _call_once(self, send: Callable[[], DeploymentResponse]) -> Any:
        """A lost replica has the agent probed and is raised; if the agent goes down while the
        call waits, the call is cancelled (AgentDown)."""
        self.raise_if_down()
        sent_at = time.monotonic()
        response = send()
        result = asyncio.ensure_future(awaited(response))
        try:
            while not await self._done_before_down(result):
                self.raise_if_down()  # (unless it came back at once: then wait on)
            return self._outcome(result, sent_at)
        finally:
            if not result.done():
                result.cancel()
                response.cancel()

    async def _done_before_down(self, result: asyncio.Future) -> bool:
        """Wait until `result` is done (True) or the agent is marked down (False); while the
        result is pending, every SUSPECT_AFTER_S, check whether the agent lost its replicas."""
        went_down = asyncio.ensure_future(self._down.wait())
        try:
            waiting = {result, went_down}
            first = asyncio.FIRST_COMPLETED
            while not (await asyncio.wait(waiting, timeout=SUSPECT_AFTER_S, return_when=first))[0]:
                self._suspect()
        finally:
            went_down.cancel()
        return result.done()

    def _outcome(self, result: asyncio.Future, sent_at: float) -> Any:
        error = result.exception()
        if error is None:
            self.answered_at = time.monotonic()
            self.latencies.append(self.answered_at - sent_at)
            if self.is_probed:  # a replica answered since the suspicion: up, as a probe says
                self._come_up()
            return result.result()
        if replica_lost(error) and sent_at >= self.up_since:  # else: news of an old replica
            self._suspect_lost(f"{type(error).__name__}: its replica was lost")
        raise error

    def _suspect(self) -> None:
        """A call waits long: unless the agent answered lately (or was just checked), ask
        Serve's controller in the background whether it lost every replica."""
        now = time.monotonic()
        quiet = now - self.answered_at > SUSPECT_AFTER_S
        if self.is_probed or not quiet or now - self._checked_at < CHECK_INTERVAL_S:
            return
        self._checked_at = now
        self._in_background(self._check_with_serve())

    async def _check_with_serve(self) -> None:
        try:
            reason = await asyncio.to_thread(
                every_replica_lost, self.handle.app_name, self.handle.deployment_name
            )
        except Exception:  # the controller did not answer: no verdict
            return
        if reason is not None:
            self._suspect_lost(reason)

    def _suspect_lost(self, reason: str) -> None:
        """Probe the agent; down, for `reason`, unless it answers within its grace."""
        if self.is_probed:
            return
        self._up.clear()
        self._in_background(self._probe_until_up())
        self._in_background(self._down_unless_back(reason))

    async def _down_unless_back(self, reason: str) -> None:
        if await self.back_within(grace_s(self.latencies)):
            return
        self.down_reason = reason
        self.down_since = time.monotonic()
        self._down.set()
        self.up_gauge.set(0)
        log.warning("agent %r is down (%s): requests leave it out", self.name, reason)

    async def _probe_until_up(self) -> None:
        while self.is_probed:  # (an answer to a call may have brought it up first)
            try:
                await asyncio.wait_for(awaited(self.handle.ready.remote()), PROBE_TIMEOUT_S)
                self._come_up()
            except Exception:  # not back yet, whatever the reason: ask again
                await asyncio.sleep(PROBE_PAUSE_S)

    def _come_up(self) -> None:
        if self.is_down:
            seconds = time.monotonic() - self.down_since
            log.warning("agent %r is up again after %.1f s down", self.name, seconds)
        self.down_reason = None
        self.up_since = self.answered_at = time.monotonic()
        self._down.clear()
        self._up.set()
        self.up_gauge.set(1)

    def _in_background(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)  # a reference, until it is done
        task.add_done_callback(self._background.discard)
