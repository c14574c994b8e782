"""`satseq eval` end to end on the tiny team: real rollout actors, real engines, files on disk.

Every agent is a copy of builtin:tiny and sampling is greedy, so all samples of a problem are
the same answer: the vote agrees fully, and pass@k, avg@k, maj@k and each agent's accuracy are
all the same number. Correctness is re-checked here with integer arithmetic, not math-verify.
"""

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import ray
import yaml
from typer.testing import CliRunner

from satseq.cli.main import app
from satseq.config import load_config
from satseq.evaluation import resolve_dataset
from satseq.evaluation.runner import run_evaluation

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def unbiased_pass_at_k(n, c, k):
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def read_predictions(output_dir):
    return [
        json.loads(line) for line in (output_dir / "predictions.jsonl").read_text().splitlines()
    ]


def test_eval_writes_predictions_summary_and_config(ray_cluster, training_output_dir, tmp_path):
    overrides = ["eval.synthetic_problems=6", "eval.temperature=0", "rollout.num_actors=2"]
    config = load_config(overrides=overrides)
    _, summary = run_evaluation(
        config, "synthetic:test", training_output_dir, tmp_path, samples_per_agent=2, stage=0
    )

    lines = read_predictions(tmp_path)
    held_out = resolve_dataset("synthetic:test", config)
    assert [line["prompt"] for line in lines] == [p.problem for p in held_out]
    # the quickstart trains on split "train": the held-out problems are the first of "test"
    assert [line["problem_id"] for line in lines] == [f"arith-test-0-{i}" for i in range(6)]
    for line in lines:
        answers = [a for name in ("a0", "a1", "a2") for a in line["individual_answers"][name]]
        assert len(answers) == 6 and len(set(answers)) == 1  # greedy copies agree
        assert line["predicted_answer"] == answers[0]
        # every sample voted for it, or (no box written) none voted at all
        assert line["agreement"] == (0.0 if answers[0] is None else 1.0)
        truth = int(line["ground_truth"])
        right = (
            answers[0] is not None and answers[0].lstrip("-").isdigit() and int(answers[0]) == truth
        )
        assert line["correct"] is right
        assert line["pass_at_k"] == unbiased_pass_at_k(6, 6 * right, 2) == line["avg_at_k"]

    assert sum(line["predicted_answer"] is not None for line in lines) >= 3  # mostly boxed
    accuracy = sum(line["correct"] for line in lines) / len(lines)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary
    assert summary["num_problems"] == 6 and summary["samples_per_agent"] == 2
    for key in ("pass@k", "avg@k", "maj@k", "team_vote_accuracy"):
        assert summary[key] == pytest.approx(accuracy)
    assert [v["accuracy"] for v in summary["per_agent"].values()] == [pytest.approx(accuracy)] * 3
    assert summary["wall_time_s"] > 0 and summary["dataset"] == "synthetic:test"

    inference = yaml.safe_load((tmp_path / "inference_config.yaml").read_text())
    assert inference["agents"]["a2"] == {
        "path": str(training_output_dir / "agent_a2" / "stage_0"),
        "stage": 0,
    }
    assert inference["sampling"]["temperature"] == 0.0 and inference["samples_per_agent"] == 2
    assert inference["config"]["eval"]["synthetic_problems"] == 6
    assert not [a for a in ray.util.list_named_actors() if a.startswith("satseq-eval")]


def test_run_inference_sh_takes_the_seeds_flags(ray_cluster, training_output_dir, tmp_path):
    data = tmp_path / "two.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"problem": f"Compute {a} + 1.", "answer": str(a + 1)}) for a in (2, 5)
        )
    )
    out = tmp_path / "out"
    result = subprocess.run(
        [
            str(ROOT / "scripts" / "run_inference.sh"),
            "--dataset",
            str(data),
            "--checkpoint_dir",
            str(training_output_dir),
            "--output_dir",
            str(out),
            "--samples-per-agent",
            "1",
            "--address",
            ray.get_runtime_context().gcs_address,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, SATSEQ=str(ROOT / ".venv/bin/satseq")),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "team" in result.stdout and "a0" in result.stdout
    assert [line["problem_id"] for line in read_predictions(out)] == ["two.jsonl:1", "two.jsonl:2"]


def test_eval_cli_reports_bad_input_without_starting_anything(training_output_dir, tmp_path):
    runner = CliRunner()
    common = ["--checkpoint-dir", str(training_output_dir), "--output-dir", str(tmp_path)]
    result = runner.invoke(app, ["eval", "--dataset", str(tmp_path / "none.jsonl"), *common])
    assert result.exit_code == 2 and "file not found" in result.output
    result = runner.invoke(app, ["eval", "--dataset", "synthetic:test", *common, "--stage", "7"])
    assert result.exit_code == 2 and "no stage 7" in result.output
    result = runner.invoke(
        app, ["eval", "--dataset", "synthetic:test", *common, "--set", "eval.top_p=5"]
    )
    assert result.exit_code == 2 and "eval.top_p" in result.output
