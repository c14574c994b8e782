"""Fixtures for end-to-end training runs."""

import subprocess
from pathlib import Path

import pytest

from tests.cluster.runs import STRAIGHT_STAGES, run_env, train_command


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory, builtin_models) -> Path:
    """An uninterrupted short quickstart run of STRAIGHT_STAGES stages: the reference that the
    resume and fault tests hold their interrupted runs against (one run serves them all)."""
    output_dir = tmp_path_factory.mktemp("straight")
    command = train_command(output_dir, STRAIGHT_STAGES)
    subprocess.run(command, check=True, timeout=600, env=run_env())
    return output_dir
