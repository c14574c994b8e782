"""Fixtures shared across test packages."""

import pytest
import ray


@pytest.fixture(scope="module")
def ray_cluster():
    """A fresh local Ray instance for the module ("local": never one `ray start` left running)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
