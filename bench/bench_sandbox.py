"""Sandbox throughput and latency: the local pool and the HTTP server against bare processes.

    python bench/bench_sandbox.py [--workers 8] [--runs 200] [--cpu-runs 48] [--port 0]
                                  [--out bench/results/sandbox.txt]

Two workloads, each run by `--workers` concurrent callers:

- `print(1+1)`: the fixed cost of one execution (start-up, isolation, clean-up);
- a CPU-bound job that spins for 150 ms of CPU time: how much the sandbox adds to real work.

Three ways to run each:

- `bare subprocess.run`: `python -c CODE` with no isolation at all, the baseline;
- `local pool`: `LocalBackend` with `--workers` slots, at whatever isolation level the probe
  finds here (printed first);
- `satseq sandbox serve`: the same backend behind the `/run_code` server, in its own process,
  called through `FusionBackend` over loopback.

For each: executions per second, p50 and p99 latency, and two ratios to the bare baseline
measured in the same run (so a loaded machine shifts both): throughput (higher is better) and
p99 (lower is better). The report is printed and written to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from satseq.sandbox.fusion_client import FusionBackend
from satseq.sandbox.local import LocalBackend, LocalSandboxSettings
from satseq.sandbox.types import ExecutionRequest, Status

WORKLOADS = {
    "print(1+1)": "print(1+1)",
    "150 ms CPU": (
        "import time\nstart = time.process_time()\n"
        "while time.process_time() - start < 0.15:\n    pass\nprint('done')"
    ),
}


def measure(call: Callable[[], None], runs: int, concurrency: int) -> tuple[float, list[float]]:
    """(executions per second, per-call latencies) for `runs` calls from `concurrency` threads."""

    def timed(_: int) -> float:
        started = time.perf_counter()
        call()
        return time.perf_counter() - started

    with ThreadPoolExecutor(concurrency) as threads:
        list(threads.map(timed, range(concurrency)))  # warm-up: one call per thread
        started = time.perf_counter()
        latencies = list(threads.map(timed, range(runs)))
        elapsed = time.perf_counter() - started
    return runs / elapsed, latencies


def measure_async(backend: FusionBackend, code: str, runs: int, concurrency: int):
    """`measure` for the HTTP client, whose connection pool lives in one event loop."""

    async def go() -> tuple[float, list[float]]:
        request = ExecutionRequest(code=code)
        gate = asyncio.Semaphore(concurrency)

        async def timed() -> float:
            async with gate:
                started = time.perf_counter()
                result = await backend.execute(request)
                assert result.status == Status.OK, result
                return time.perf_counter() - started

        await asyncio.gather(*(timed() for _ in range(concurrency)))
        started = time.perf_counter()
        latencies = await asyncio.gather(*(timed() for _ in range(runs)))
        elapsed = time.perf_counter() - started
        await backend.aclose()
        return runs / elapsed, list(latencies)

    return asyncio.run(go())


def bare(code: str) -> Callable[[], None]:
    def call() -> None:
        # A session of its own, like each sandbox run: with the kernel's autogroup scheduling,
        # runs sharing the benchmark's session would share one CPU share between them, while
        # each slot's cgroup gets its own, and on a loaded machine the sandbox would look faster.
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, check=True, start_new_session=True
        )

    return call


def in_pool(backend: LocalBackend, code: str) -> Callable[[], None]:
    request = ExecutionRequest(code=code)

    def call() -> None:
        result = backend.run(request)
        assert result.status == Status.OK, result

    return call


def start_server(workers: int, port: int) -> tuple[subprocess.Popen, str]:
    """`serve()` in a child process, as `satseq sandbox serve` runs it; waits for /v1/ping."""
    if port == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    script = (
        "from satseq.sandbox.local import LocalSandboxSettings\n"
        "from satseq.sandbox.server import serve\n"
        f"serve(LocalSandboxSettings(workers={workers}), port={port})\n"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/ping", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the sandbox server did not start within 120 s")


def percentile(latencies: list[float], level: int) -> float:
    return statistics.quantiles(latencies, n=100, method="inclusive")[level - 1]


def row(name: str, measured: tuple[float, list[float]], baseline: tuple[float, list[float]]) -> str:
    throughput, latencies = measured
    p99 = percentile(latencies, 99)
    return (
        f"{name:24} {throughput:9.1f} {percentile(latencies, 50) * 1000:9.1f} {p99 * 1000:9.1f} "
        f"{throughput / baseline[0]:9.2f} {p99 / percentile(baseline[1], 99):11.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=200, help="print(1+1) executions per method")
    parser.add_argument("--cpu-runs", type=int, default=48, help="150 ms jobs per method")
    parser.add_argument("--port", type=int, default=0, help="server port; 0 picks a free one")
    parser.add_argument("--out", type=Path, default=Path("bench/results/sandbox.txt"))
    args = parser.parse_args()

    backend = LocalBackend(LocalSandboxSettings(workers=args.workers))
    lines = [
        f"# python bench/bench_sandbox.py  ({os.cpu_count()} CPU cores)",
        backend.isolation.describe(),
    ]
    print("\n".join(lines))
    server, url = start_server(args.workers, args.port)
    try:
        for workload, code in WORKLOADS.items():
            runs = args.runs if workload == "print(1+1)" else args.cpu_runs
            baseline = measure(bare(code), runs, args.workers)
            pool = measure(in_pool(backend, code), runs, args.workers)
            http = measure_async(FusionBackend(url, max_concurrency=args.workers), code, runs,
                                 args.workers)  # fmt: skip
            table = [
                "",
                f"{workload}: {runs} runs, {args.workers} concurrent callers",
                f"{'method':24} {'exec/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'x bare':>9} "
                f"{'p99 x bare':>11}",
                row("bare subprocess.run", baseline, baseline),
                row("local pool", pool, baseline),
                row("satseq sandbox serve", http, baseline),
            ]
            print("\n".join(table))
            lines += table
    finally:
        server.terminate()
        server.wait(timeout=60)
        backend.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
