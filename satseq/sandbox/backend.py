"""The one sandbox interface (DESIGN §6) and the factory that builds a backend from config."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Protocol

from satseq.config.schema import SandboxConfig
from satseq.sandbox.fusion_client import FusionBackend
from satseq.sandbox.local import LocalBackend, LocalSandboxSettings
from satseq.sandbox.types import ExecutionRequest, ExecutionResult, IsolationLevel


class SandboxBackend(Protocol):
    """Runs requests; a failed run is a `sandbox_error` result, never an exception."""

    name: str

    async def execute(self, request: ExecutionRequest) -> ExecutionResult: ...

    async def aclose(self) -> None: ...

    def stats(self) -> dict[str, Any]:
        """What the backend knows about itself, for the pool's metrics."""
        ...


def local_settings(config: SandboxConfig) -> LocalSandboxSettings:
    """The local backend's settings from the `sandbox:` config section.

    Each config key sets the setting of the same name (STYLE: a YAML key names what it sets);
    keys the local backend does not have (`backend`, `url`) are skipped, and a setting the
    section does not have, or leaves as null, keeps its default.
    """
    names = {setting.name for setting in fields(LocalSandboxSettings)}
    values = {k: v for k, v in config.model_dump().items() if k in names and v is not None}
    values["min_isolation"] = IsolationLevel(config.min_isolation)
    return LocalSandboxSettings(**values)


def make_backend(config: SandboxConfig) -> SandboxBackend:
    """The backend `config.backend` names. Call it inside the event loop that will use it.

    Raises:
        SandboxUnavailable: the local backend is below `config.min_isolation`.
    """
    if config.backend == "sandbox_fusion":
        return FusionBackend(
            config.url,
            timeout_s=config.timeout_s,
            memory_mb=config.memory_mb,
            max_output_bytes=config.max_output_bytes,
            max_concurrency=config.workers,
        )
    return LocalBackend(local_settings(config))
