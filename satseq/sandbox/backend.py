"""The one sandbox interface (design §6). `satseq.launch.settings.sandbox_backend` builds the
backend a config names; the sandbox itself knows nothing of the run configuration."""

from __future__ import annotations

from typing import Any, Protocol

from satseq.sandbox.types import ExecutionRequest, ExecutionResult


class SandboxBackend(Protocol):
    """Runs requests; a failed run is a `sandbox_error` result, never an exception."""

    name: str

    async def execute(self, request: ExecutionRequest) -> ExecutionResult: ...

    async def aclose(self) -> None: ...

    def stats(self) -> dict[str, Any]:
        """What the backend knows about itself, for the pool's metrics."""
        ...
