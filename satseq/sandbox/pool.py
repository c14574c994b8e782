"""The SandboxPool actor: the sandbox as a shared Ray service for rollout workers (design §6).

    pool = SandboxPoolActor.remote(partial(sandbox_backend, config.sandbox), workers=8)
    ray.get(pool.start.remote())  # fails here if the sandbox is below its minimum level
    result = await pool.execute.remote(ExecutionRequest(code="print(1 + 1)"))

- Bounded concurrency: `workers` tasks take requests from one queue; each runs one request
  at a time on the backend.
- Backpressure: the queue holds at most `queue_size` requests; `execute` waits for room, so
  a flood of callers slows down instead of piling up memory.
- Restarts: a worker task that died is replaced on the next call (`worker_restarts`); the
  local backend replaces dead slot supervisors itself (`backend.restarts`).
- Metrics: executions, statuses, latency percentiles, queue depth, restarts, and the
  backend's own (`SandboxBackend.stats`).

The backend is made by `backend_factory` inside the actor's event loop, on first use, because
an HTTP backend's connection pool belongs to the loop that made it.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import ray

from satseq.sandbox.backend import SandboxBackend
from satseq.sandbox.types import ExecutionRequest, ExecutionResult, sandbox_error

logger = logging.getLogger(__name__)

LATENCY_WINDOW = 4096  # latencies kept for the percentiles


class SandboxPool:
    """Queue + workers in front of one backend; see the module docstring."""

    def __init__(
        self,
        backend_factory: Callable[[], SandboxBackend],
        workers: int,
        queue_size: int = 256,
    ) -> None:
        self._backend_factory = backend_factory
        self._workers_wanted = workers
        self._queue_size = queue_size
        self._backend: SandboxBackend | None = None
        self._starting = asyncio.Lock()
        self._queue: asyncio.Queue | None = None
        self._workers: list[asyncio.Task] = []
        self._running = 0
        self._worker_restarts = 0
        self._statuses: Counter[str] = Counter()
        self._latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)

    async def _ensure_workers(self) -> asyncio.Queue:
        async with self._starting:  # the first callers all wait for the one backend
            if self._backend is None:
                # The local backend's start-up blocks (it starts and probes the slots).
                self._backend = await asyncio.to_thread(self._backend_factory)
                self._queue = asyncio.Queue(maxsize=self._queue_size)
        for index, task in enumerate(self._workers):
            if task.done():
                logger.warning("sandbox pool worker %d died (%r); restarting it", index, task)
                self._worker_restarts += 1
                self._workers[index] = asyncio.create_task(self._work())
        while len(self._workers) < self._workers_wanted:
            self._workers.append(asyncio.create_task(self._work()))
        return self._queue

    async def start(self) -> dict[str, Any]:
        """Start the backend now rather than on the first request, and return the metrics.

        Raises:
            SandboxUnavailable: the local backend is below `sandbox.min_isolation`; call this
                at start-up to fail there, not on the first tool call.
        """
        await self._ensure_workers()
        return await self.metrics()

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """Run `request` once a worker is free; waits while the queue is full."""
        queue = await self._ensure_workers()
        reply = asyncio.get_running_loop().create_future()
        await queue.put((request, reply, time.monotonic()))
        return await reply

    async def _work(self) -> None:
        while True:
            request, reply, enqueued = await self._queue.get()
            self._running += 1
            try:
                result = await self._backend.execute(request)
            except Exception as error:  # a backend bug must not hang the caller
                logger.exception("sandbox backend raised")
                message = f"sandbox pool: the backend raised {error!r}"
                result = sandbox_error(message, self._backend.name)
            except BaseException:  # the worker itself is dying: answer, then let it die
                if not reply.done():
                    message = "sandbox pool: the worker stopped during this run"
                    reply.set_result(sandbox_error(message, self._backend.name))
                raise
            finally:
                self._running -= 1
                self._queue.task_done()
            self._statuses[result.status] += 1
            self._latencies.append(time.monotonic() - enqueued)
            if not reply.done():  # the caller may have been cancelled
                reply.set_result(result)

    async def metrics(self) -> dict[str, Any]:
        """Counters since start; latency is enqueue-to-result, over the last few thousand."""
        latencies = sorted(self._latencies)
        percentiles = {}
        if len(latencies) >= 2:
            cuts = statistics.quantiles(latencies, n=100, method="inclusive")
            percentiles = {"p50": cuts[49], "p99": cuts[98]}
        return {
            "backend": self._backend.stats() if self._backend else {},
            "executions": sum(self._statuses.values()),
            "statuses": dict(self._statuses),
            "latency_s": {"mean": statistics.fmean(latencies), **percentiles} if latencies else {},
            "queued": self._queue.qsize() if self._queue else 0,
            "running": self._running,
            "worker_restarts": self._worker_restarts,
        }

    async def shutdown(self) -> None:
        """Stop the workers and the backend (the local one stops every slot)."""
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        if self._backend is not None:
            await self._backend.aclose()
            self._backend = None


SandboxPoolActor = ray.remote(SandboxPool)
"""The Ray actor class; placement (resources, node) is chosen by `cluster/` via `.options`."""
