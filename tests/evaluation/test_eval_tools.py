"""`satseq eval` with tools (design §5): a team trained with tools is scored through the tool
loop, its code run by a sandbox pool of the evaluation's own, and summary.json says how much.

The team is builtin:tiny-tool, the tiny model warm-started on sandbox traces
(`<code>print(7+9)</code>`, then the interpreter's `16`, then `\\boxed{16}`), laid out as a
training output dir whose train_config.yaml is configs/quickstart_tools.yaml.
"""

import json
import shutil
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

from satseq.cli.main import app
from satseq.config import TRAIN_CONFIG, dump_config, load_config, run_config_for
from satseq.evaluation.runner import run_evaluation
from satseq.models import resolve_model_path
from tests.evaluation.conftest import AGENTS

ROOT = Path(__file__).resolve().parents[2]
TOOLS_CONFIG = ROOT / "configs" / "quickstart_tools.yaml"
pytestmark = pytest.mark.slow


def tool_team(root: Path, train_config: Path | None) -> Path:
    tool_model = resolve_model_path("builtin:tiny-tool")
    for name in AGENTS:
        shutil.copytree(tool_model, root / f"agent_{name}" / "stage_0")
    if train_config is not None:
        (root / TRAIN_CONFIG).write_text(dump_config(load_config(train_config)))
    return root


@pytest.fixture(scope="module")
def tool_trained_team(tmp_path_factory):
    return tool_team(tmp_path_factory.mktemp("tool-run"), TOOLS_CONFIG)


def test_a_tool_trained_teams_eval_calls_the_sandbox(ray_cluster, tool_trained_team, tmp_path):
    config = run_config_for(tool_trained_team, ["eval.synthetic_problems=4", "eval.temperature=0"])
    assert config.rollout.tools.enabled  # from the team's train_config.yaml
    evaluation, summary = run_evaluation(
        config, "synthetic:test", tool_trained_team, tmp_path, samples_per_agent=1
    )

    calls = evaluation.tool_calls()  # every sample's sandbox runs, from the tool loop
    assert len(calls) == 4 * len(AGENTS)
    tools = summary["tools"]
    assert tools["call_fraction"] == sum(n > 0 for n in calls) / len(calls) > 0
    assert tools["calls_mean"] == pytest.approx(sum(calls) / len(calls))
    # the pool's own counts: every call the loop made was executed by the sandbox
    assert sum(tools["statuses"].values()) == sum(calls)
    assert tools["statuses"].get("ok", 0) > 0
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    # the rollout actors and the sandbox pool are gone
    assert not [a for a in ray.util.list_named_actors() if a.startswith("satseq-eval")]


def test_eval_tools_flag_turns_the_loop_on(ray_cluster, tmp_path):
    team = tool_team(tmp_path / "team", None)  # no train_config.yaml: the quickstart's, no tools
    assert not run_config_for(team, []).rollout.tools.enabled
    config = run_config_for(team, [], tools=True)
    assert config.rollout.tools.enabled and config.data.prompt.tool_prompt

    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--dataset",
            "synthetic:test",
            "--checkpoint-dir",
            str(team),
            "--output-dir",
            str(out),
            "--samples-per-agent",
            "1",
            "--tools",
            "--set",
            "eval.synthetic_problems=2",
            "--set",
            "rollout.max_new_tokens=48",
            "--set",
            "data.synthetic.difficulty=1",  # the level the tool model was warm-started on
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tools"]["call_fraction"] > 0 and sum(summary["tools"]["statuses"].values()) > 0
    assert "tools:" in result.output  # the table's caption


def test_eval_without_tools_writes_no_tools_summary(ray_cluster, training_output_dir, tmp_path):
    config = load_config(overrides=["eval.synthetic_problems=1", "eval.max_new_tokens=8"])
    _, summary = run_evaluation(
        config, "synthetic:test", training_output_dir, tmp_path, samples_per_agent=1
    )
    assert "tools" not in summary
