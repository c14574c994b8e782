"""Tool-augmented training end to end: `satseq train configs/quickstart_tools.yaml`, shortened."""

import subprocess
from pathlib import Path

import pytest

from tests.cluster.runs import read_metrics, run_env, train_command

pytestmark = pytest.mark.slow

TOOLS_CONFIG = Path(__file__).parents[2] / "configs" / "quickstart_tools.yaml"


def test_quickstart_tools_runs_the_models_code_in_the_sandbox(tmp_path, builtin_models):
    """builtin_models: the tool-use tiny model built (or found) before the timed run."""
    output_dir = tmp_path / "tools"
    subprocess.run(
        train_command(output_dir, 1, str(TOOLS_CONFIG)),
        check=True,
        timeout=600,
        env=run_env(),
    )
    (metrics,) = read_metrics(output_dir)
    assert metrics["tools/call_fraction"] > 0
    assert metrics["tools/calls_mean"] > 0
    assert metrics["sandbox/ok"] > 0
