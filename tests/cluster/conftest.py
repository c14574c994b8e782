"""Fixtures for end-to-end training runs."""

import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def built_quickstart_model():
    """Build (or find in the cache) the embedded model once, outside any timed run."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from satseq.models import resolve_builtin; resolve_builtin('builtin:tiny')",
        ],
        check=True,
        timeout=900,
    )
