"""docs/tutorial.md runs as written: its `bash` blocks, in order, in an empty directory."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.runs import run_env

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"

pytestmark = pytest.mark.slow


def bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", markdown, flags=re.M | re.S)


def test_the_tutorial_reads_as_bash_blocks_and_a_console_one():
    blocks = bash_blocks(TUTORIAL.read_text())
    assert len(blocks) == 4
    assert blocks[-1].startswith("satseq train my_team.yaml")
    assert "```console\n$ ray start --head" in TUTORIAL.read_text()  # the cluster's: not run


def test_the_tutorials_commands_train_evaluate_and_merge_a_lora_team(tmp_path):
    script = "set -euo pipefail\n" + "\n".join(bash_blocks(TUTORIAL.read_text()))
    env = run_env() | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    run = tmp_path / "runs" / "my_team"
    for agent in ("solver", "checker"):
        assert (run / f"agent_{agent}" / "stage_1" / "adapter_config.json").is_file()
    summary = json.loads((run / "eval" / "summary.json").read_text())
    assert summary["num_problems"] == 32  # my_test.jsonl's rows, read through the field map
    assert sorted(summary["agents"]) == ["checker", "solver"]
    assert 0.0 <= summary["team_vote_accuracy"] <= 1.0
    predictions = (run / "eval" / "predictions.jsonl").read_text().splitlines()
    assert json.loads(predictions[0])["problem_id"] == "q64"  # the first held-out row's id
    merged = tmp_path / "solver-merged"
    assert (merged / "config.json").is_file() and not (merged / "adapter_config.json").exists()
