"""Tool-augmented training end to end: `satseq train configs/quickstart_tools.yaml`, shortened."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.runs import read_metrics, run_env, train_command

pytestmark = pytest.mark.slow

TOOLS_CONFIG = Path(__file__).parents[2] / "configs" / "quickstart_tools.yaml"


@pytest.fixture(scope="module")
def built_tool_model():
    """Build (or find in the cache) the tool-use tiny model once, outside the timed run."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from satseq.models import resolve_builtin; resolve_builtin('builtin:tiny-tool')",
        ],
        check=True,
        timeout=900,
    )


def test_quickstart_tools_runs_the_models_code_in_the_sandbox(tmp_path, built_tool_model):
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
