"""Fixtures for end-to-end training runs."""

import subprocess
from pathlib import Path

import pytest

from tests.cluster.runs import (
    SPO_STAGES,
    STRAIGHT_STAGES,
    run_env,
    spo_run_args,
    train_command,
)


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory, builtin_models) -> Path:
    """An uninterrupted short quickstart run of STRAIGHT_STAGES stages: the reference that the
    resume and fault tests hold their interrupted runs against (one run serves them all), and
    the run that every tracker logs (`test_trackers`)."""
    output_dir = tmp_path_factory.mktemp("straight")
    trackers = ["--set", "output.trackers=[tensorboard, mlflow, wandb]"]
    command = train_command(output_dir, STRAIGHT_STAGES, *trackers)
    # offline even where a developer's W&B API key is set: the test reads the run's files
    subprocess.run(command, check=True, timeout=600, env=run_env() | {"WANDB_MODE": "offline"})
    return output_dir


@pytest.fixture(scope="session")
def spo_run(tmp_path_factory, builtin_models) -> tuple[Path, list[str]]:
    """An uninterrupted SPO run of SPO_STAGES stages with offline priors, and the arguments that
    made it: what `test_train_spo` checks, and the reference of SPO's resume test."""
    root = tmp_path_factory.mktemp("spo")
    args = spo_run_args(root)
    output_dir = root / "run"
    subprocess.run(
        train_command(output_dir, SPO_STAGES, *args), check=True, timeout=600, env=run_env()
    )
    return output_dir, args
