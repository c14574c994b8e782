"""One short real training shared by the observe tests (Ray metrics, report, TensorBoard)."""

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.observed_run import REPO
from tests.run_once import built_once


@dataclass(frozen=True)
class ObservedRun:
    output_dir: Path  # a `satseq train` output directory
    ray_metrics: str  # Ray's Prometheus text after the last stage


@pytest.fixture(scope="session")
def observed_run(tmp_path_factory, builtin_models) -> ObservedRun:
    def observe(out: Path) -> None:
        command = [sys.executable, "-m", "tests.deploy.observed_run", str(out)]
        subprocess.run(command, cwd=REPO, check=True, timeout=1200)

    out = built_once(tmp_path_factory, "observed", observe)
    return ObservedRun(out / "run", (out / "ray_metrics.txt").read_text())
