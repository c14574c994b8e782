"""The SandboxPool: bounded concurrency, backpressure, worker restarts and metrics, first in
this process with a scripted backend, then as a Ray actor on the real local backend."""

import asyncio
import os
import signal
from functools import partial

import ray

from satseq.config.rollout import SandboxConfig
from satseq.launch.settings import sandbox_backend
from satseq.sandbox.pool import SandboxPool, SandboxPoolActor
from satseq.sandbox.types import ExecutionRequest, ExecutionResult, Status


class WorkerCrash(BaseException):
    """Escapes `except Exception`, so it kills the pool worker that meets it."""


class ScriptedBackend:
    """Echoes the code after `delay` seconds; code "raise" raises, "crash" kills the worker."""

    name = "local"

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.running = self.peak = 0

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(self.delay)
            if request.code == "raise":
                raise RuntimeError("backend bug")
            if request.code == "crash":
                raise WorkerCrash
            return ExecutionResult(status=Status.OK, stdout=request.code, backend="local")
        finally:
            self.running -= 1

    def stats(self):
        return {"name": "scripted"}

    async def aclose(self):
        pass


def run_pool(backend, workers, queue_size, scenario):
    async def go():
        pool = SandboxPool(lambda: backend, workers=workers, queue_size=queue_size)
        try:
            return await asyncio.wait_for(scenario(pool), timeout=30)
        finally:
            await pool.shutdown()

    return asyncio.run(go())


def request(code: str) -> ExecutionRequest:
    return ExecutionRequest(code=code)


def test_concurrency_is_bounded_by_the_workers_and_results_match_requests():
    backend = ScriptedBackend(delay=0.02)

    async def scenario(pool):
        return await asyncio.gather(*(pool.execute(request(str(n))) for n in range(12)))

    results = run_pool(backend, workers=3, queue_size=64, scenario=scenario)
    assert [r.stdout for r in results] == [str(n) for n in range(12)]
    assert backend.peak == 3


def test_a_full_queue_makes_callers_wait():
    backend = ScriptedBackend(delay=0.05)

    async def scenario(pool):
        calls = [asyncio.create_task(pool.execute(request(str(n)))) for n in range(6)]
        await asyncio.sleep(0.02)
        depth = (await pool.metrics())["queued"]
        results = await asyncio.gather(*calls)
        return depth, results

    depth, results = run_pool(backend, workers=1, queue_size=2, scenario=scenario)
    assert depth == 2  # one running, two queued, three callers waiting for room
    assert [r.status for r in results] == [Status.OK] * 6


def test_a_raising_backend_gives_a_sandbox_error_and_the_pool_goes_on():
    async def scenario(pool):
        failed = await pool.execute(request("raise"))
        return failed, await pool.execute(request("fine"))

    failed, fine = run_pool(ScriptedBackend(), workers=1, queue_size=4, scenario=scenario)
    assert failed.status == Status.SANDBOX_ERROR and "backend bug" in failed.stderr
    assert fine.stdout == "fine"


def test_a_dead_worker_is_restarted_and_counted():
    async def scenario(pool):
        crashed = await pool.execute(request("crash"))
        await asyncio.sleep(0)  # let the dying worker finish
        after = await pool.execute(request("after"))
        return crashed, after, await pool.metrics()

    crashed, after, metrics = run_pool(ScriptedBackend(), 1, 4, scenario)
    assert crashed.status == Status.SANDBOX_ERROR
    assert after.stdout == "after"
    assert metrics["worker_restarts"] == 1


def test_metrics_count_statuses_and_latency():
    async def scenario(pool):
        for code in ("a", "b", "raise"):
            await pool.execute(request(code))
        return await pool.metrics()

    metrics = run_pool(ScriptedBackend(delay=0.01), 2, 4, scenario)
    assert metrics["executions"] == 3
    assert metrics["statuses"] == {Status.OK: 2, Status.SANDBOX_ERROR: 1}
    assert 0 < metrics["latency_s"]["p50"] <= metrics["latency_s"]["p99"] < 5
    assert metrics["backend"] == {"name": "scripted"}


def test_the_ray_actor_runs_code_in_the_local_sandbox_and_survives_a_dead_slot(ray_cluster):
    config = SandboxConfig(workers=2, min_isolation="full")
    pool = SandboxPoolActor.remote(partial(sandbox_backend, config), workers=2)
    try:
        assert ray.get(pool.start.remote(), timeout=120)["backend"]["isolation"] == "full"
        results = ray.get(
            [pool.execute.remote(request(f"print({n} ** 2)")) for n in range(4)], timeout=120
        )
        assert [r.stdout for r in results] == [f"{n**2}\n" for n in range(4)]
        metrics = ray.get(pool.metrics.remote(), timeout=30)
        assert metrics["statuses"] == {Status.OK: 4}
        for pid in metrics["backend"]["supervisor_pids"]:
            os.kill(pid, signal.SIGKILL)
        again = ray.get(pool.execute.remote(request("print('again')")), timeout=120)
        assert again.stdout == "again\n"
        assert ray.get(pool.metrics.remote(), timeout=30)["backend"]["restarts"] >= 1
    finally:
        ray.get(pool.shutdown.remote(), timeout=60)
        ray.kill(pool)
