"""Fixtures shared across test packages."""

import subprocess
import sys

import pytest
import ray

from satseq.models import BUILTIN_MODELS, build_tiny_model, builtin_dir

BUILD_BUILTINS = "import sys\nfrom satseq.models import resolve_builtin\n" + (
    "for name in sys.argv[1:]:\n    resolve_builtin(name)\n"
)


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


@pytest.fixture(scope="session")
def builtin_models():
    """Every `builtin:tiny*` model built (or found) in the model cache ($SATSEQ_CACHE, else
    ~/.cache/satseq) before any test times anything. A build trains on one thread, so two
    processes build them two at a time; no process starts for a model already in the cache."""
    names = sorted(name for name in BUILTIN_MODELS if not builtin_dir(name).is_dir())
    builders = [
        subprocess.Popen([sys.executable, "-c", BUILD_BUILTINS, *names[half::2]])
        for half in range(min(2, len(names)))
    ]
    for builder in builders:
        assert builder.wait(timeout=1800) == 0, "building the builtin models failed"
