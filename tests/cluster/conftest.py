"""Fixtures for end-to-end training runs."""

import subprocess
from pathlib import Path

import pytest

from tests.cluster.runs import STRAIGHT_STAGES, run_env, train_command
from tests.run_once import built_once


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory, builtin_models) -> Path:
    """An uninterrupted short quickstart run of STRAIGHT_STAGES stages: the reference that the
    resume and fault tests hold their interrupted runs against (one run serves them all), and
    the run that every tracker logs (`test_trackers`)."""
    trackers = ["--set", "output.trackers=[tensorboard, mlflow, wandb]"]

    def train(output_dir: Path) -> None:
        command = train_command(output_dir, STRAIGHT_STAGES, *trackers)
        # offline even where a developer's W&B API key is set: the test reads the run's files
        env = run_env() | {"WANDB_MODE": "offline"}
        subprocess.run(command, check=True, timeout=600, env=env)

    return built_once(tmp_path_factory, "straight", train)
