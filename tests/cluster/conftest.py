"""Fixtures for end-to-end training runs."""

import subprocess
import sys

import pytest

# builtin:tiny (what most runs override the team with) and the quickstart team's models
BUILD_QUICKSTART_MODELS = """
from satseq.config import load_config
from satseq.models import resolve_builtin
names = {'builtin:tiny'} | {a.path for a in load_config().team.agents}
for name in sorted(names):
    resolve_builtin(name)
"""


@pytest.fixture(scope="session")
def built_quickstart_model():
    """Build (or find in the cache) the embedded models once, outside any timed run."""
    subprocess.run([sys.executable, "-c", BUILD_QUICKSTART_MODELS], check=True, timeout=900)
