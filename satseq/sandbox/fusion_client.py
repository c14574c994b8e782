"""The SandboxFusion backend: our own client for a `/run_code` server (design §6).

Not the PyPI `sandbox-fusion` client, which silently drops `memory_limit_MB`.

- One `httpx.AsyncClient` (one connection pool) and a semaphore bound the requests in flight.
- Each request may take the run timeout + the compile timeout + 10 s, the server's own
  overheads included; past that it is a `sandbox_error`, not retried (the run may be stuck).
- Connection errors, 5xx answers and SandboxError answers are retried with exponential
  backoff and jitter; a 4xx answer is not (the request itself is wrong).
- Every failure ends as a `sandbox_error` result, never an exception: a rollout shows the
  model the error text and goes on.

Create and use one instance inside one event loop (the connection pool belongs to it).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
from pydantic import ValidationError

from satseq.sandbox.fusion_api import (
    RunCodeResponse,
    RunStatus,
    from_fusion_response,
    to_fusion_request,
)
from satseq.sandbox.types import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    ExecutionRequest,
    ExecutionResult,
    sandbox_error,
)

RESPONSE_GRACE_S = 10.0


class FusionBackend:
    """A SandboxFusion-compatible server as a sandbox backend."""

    name = "sandbox_fusion"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        compile_timeout_s: float = 10.0,
        max_concurrency: int = 8,
        max_retries: int = 3,
        backoff_s: float = 0.2,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """
        Args:
            url: the server's base URL, e.g. http://127.0.0.1:8080.
            timeout_s, memory_mb, max_output_bytes: defaults for requests that leave them out.
            max_concurrency: requests in flight at once (and pooled connections).
            max_retries: further attempts after a retryable failure.
            backoff_s: the first retry's delay; it doubles with each further retry.
            transport: an httpx transport to use instead of the network (tests).
        """
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.max_output_bytes = max_output_bytes
        self.compile_timeout_s = compile_timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._client = httpx.AsyncClient(
            base_url=self.url,
            limits=httpx.Limits(max_connections=max_concurrency),
            transport=transport,
        )
        self._in_flight = asyncio.Semaphore(max_concurrency)

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """Run `request` on the server; see the module docstring for retries and failures."""
        payload = to_fusion_request(
            request, self.timeout_s, self.memory_mb, self.max_output_bytes, self.compile_timeout_s
        )
        max_output_bytes = payload.max_output_bytes
        deadline_s = payload.run_timeout + payload.compile_timeout + RESPONSE_GRACE_S
        failure = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = self.backoff_s * 2 ** (attempt - 1)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            try:
                async with self._in_flight:
                    response = await self._client.post(
                        "/run_code",
                        content=payload.model_dump_json(),
                        timeout=deadline_s,
                        headers={"content-type": "application/json"},
                    )
            except (httpx.ReadTimeout, httpx.WriteTimeout):
                return self._error(f"no answer within {deadline_s:.0f} s")
            except httpx.TransportError as error:  # connection refused, reset, DNS, ...
                failure = f"cannot reach the server: {type(error).__name__}: {error}"
                continue
            if response.status_code >= 500:
                failure = f"HTTP {response.status_code}: {response.text[:500]}"
                continue
            if response.status_code >= 400:
                return self._error(
                    f"the server rejected the request (HTTP {response.status_code}): "
                    f"{response.text[:2000]}"
                )
            try:
                answer = RunCodeResponse.model_validate_json(response.content)
            except ValidationError as error:
                return self._error(f"the server's answer is not a /run_code response: {error}")
            if answer.status == RunStatus.SANDBOX_ERROR:
                failure = f"SandboxError: {answer.message[:2000]}"
                continue
            return from_fusion_response(answer, max_output_bytes)
        return self._error(f"gave up after {self.max_retries + 1} attempts; last: {failure}")

    def _error(self, message: str) -> ExecutionResult:
        return sandbox_error(f"sandbox_fusion {self.url}: {message}", self.name)

    def stats(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url}

    async def aclose(self) -> None:
        await self._client.aclose()
