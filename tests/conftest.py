"""Fixtures shared across test packages."""

import pytest
import ray

from satseq.models import build_tiny_model


@pytest.fixture(scope="module")
def ray_cluster():
    """A fresh local Ray instance for the module ("local": never one `ray start` left running)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def raw_tiny_model(tmp_path_factory):
    """A tiny Qwen2 model with one warm-start step: builds in seconds, behaves like any policy."""
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", warm_start_steps=1))
