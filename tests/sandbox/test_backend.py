"""The `sandbox:` config section builds the backend it names."""

import asyncio

from satseq.config.rollout import SandboxConfig
from satseq.launch.settings import local_sandbox_settings, sandbox_backend
from satseq.sandbox.fusion_client import FusionBackend
from satseq.sandbox.local import LocalSandboxSettings
from satseq.sandbox.types import IsolationLevel


def test_config_keys_set_the_local_settings_of_the_same_name():
    config = SandboxConfig(workers=3, timeout_s=2.5, memory_mb=300, min_isolation="namespaces")
    settings = local_sandbox_settings(config)
    assert (settings.workers, settings.timeout_s, settings.memory_mb) == (3, 2.5, 300)
    assert settings.min_isolation == IsolationLevel.NAMESPACES
    assert settings.disk_mb == LocalSandboxSettings().disk_mb  # not in the section: default


def test_the_sandbox_fusion_backend_gets_the_url_and_limits():
    config = SandboxConfig(backend="sandbox_fusion", url="http://127.0.0.1:9/", workers=5)

    async def build():
        backend = sandbox_backend(config)
        await backend.aclose()
        return backend

    backend = asyncio.run(build())
    assert isinstance(backend, FusionBackend)
    assert backend.stats() == {"name": "sandbox_fusion", "url": "http://127.0.0.1:9"}
    assert backend.memory_mb == config.memory_mb
