"""Fixtures shared across test packages, and how `make test` spreads the suite over the
machine's cores (pytest-xdist: `-n auto --dist loadgroup`)."""

import os
import subprocess
import sys
from collections import Counter

import psutil
import pytest
import ray

from satseq.models import BUILTIN_MODELS, build_tiny_model, builtin_dir

BUILD_BUILTINS = "import sys\nfrom satseq.models import resolve_builtin\n" + (
    "for name in sys.argv[1:]:\n    resolve_builtin(name)\n"
)


WORKER_PEAK_GIB = 10
"""What one xdist worker may hold at its peak: the SmolLM2 end-to-end tests reach ~9 GiB."""


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: a worker per core, as many as the machine's memory holds at their peaks."""
    memory_workers = psutil.virtual_memory().total // (WORKER_PEAK_GIB * 2**30)
    return max(1, min(len(os.sched_getaffinity(0)), memory_workers))


WHOLE_PACKAGES = ("tests/serving/",)
"""Packages one worker runs whole: their package-scoped fixture (the served team) is built once
a worker enters the package and torn down when it leaves."""


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`: a worker takes a whole test file (its module fixtures built once), a
    whole package of WHOLE_PACKAGES, or a whole `xdist_group` (tests that must not run beside
    each other: tests/e2e's, which each need most of a worker's memory)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileOrGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = super()._split_scope(nodeid)
            if group != nodeid:
                return group
            package = next((p for p in WHOLE_PACKAGES if nodeid.startswith(p)), None)
            return package or nodeid.split("::", 1)[0]

    return FileOrGroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Under xdist, the files with the most slow tests first: a worker free at the end then
    takes short files, not a training run that keeps the other waiting."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
        items.sort(key=lambda item: -slow[item.path])


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


@pytest.fixture(scope="session")
def s3_bucket():
    """A real S3-compatible server (moto's, on 127.0.0.1) with an empty bucket: its
    `output.storage` URI base, `s3://bucket?...`. Credentials as any S3 client reads them."""
    import time

    import httpx

    from satseq.actors.sharding import free_address

    port = int(free_address("127.0.0.1").rsplit(":", 1)[1])
    moto_server = os.path.join(os.path.dirname(sys.executable), "moto_server")
    server = subprocess.Popen(
        [moto_server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
            break
        except httpx.TransportError:
            assert server.poll() is None and time.monotonic() < deadline, "no moto_server"
            time.sleep(0.2)
    credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    before = {name: os.environ.get(name) for name in credentials}
    os.environ.update(credentials)
    from pyarrow import fs

    options = f"region=us-east-1&endpoint_override=127.0.0.1:{port}&scheme=http"
    creating, _ = fs.FileSystem.from_uri(f"s3://satseq-runs?{options}&allow_bucket_creation=true")
    creating.create_dir("satseq-runs")
    yield lambda prefix: f"s3://satseq-runs/{prefix}?{options}"
    server.terminate()
    server.wait(timeout=30)
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
