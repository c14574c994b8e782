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

from satseq.algo.eval_metrics import sign_test_p_value
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


def write_earlier_eval(directory: Path, correct: dict[str, bool]) -> Path:
    """An earlier eval's predictions: problem id → its vote correct."""
    directory.mkdir()
    lines = [json.dumps({"problem_id": i, "correct": right}) for i, right in correct.items()]
    (directory / "predictions.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def held_out_ids(correct: list[bool]) -> dict[str, bool]:
    """The first len(correct) held-out synthetic problems' ids → correct."""
    return {f"arith-test-0-{i}": right for i, right in enumerate(correct)}


def test_eval_writes_predictions_summary_and_config(ray_cluster, training_output_dir, tmp_path):
    overrides = ["eval.synthetic_problems=6", "eval.temperature=0", "rollout.num_actors=2"]
    config = load_config(overrides=overrides)
    earlier = [True, False, True, False, True, False]
    against = write_earlier_eval(tmp_path / "earlier", held_out_ids(earlier))
    output_dir = tmp_path / "out"
    _, summary = run_evaluation(
        config,
        "synthetic:test",
        training_output_dir,
        output_dir,
        samples_per_agent=2,
        stage=0,
        against=against,
    )

    lines = read_predictions(output_dir)
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
    on_disk = json.loads((output_dir / "summary.json").read_text())
    assert on_disk == summary
    assert summary["num_problems"] == 6 and summary["samples_per_agent"] == 2
    for key in ("pass@k", "avg@k", "maj@k", "team_vote_accuracy"):
        assert summary[key] == pytest.approx(accuracy)
    assert [v["accuracy"] for v in summary["per_agent"].values()] == [pytest.approx(accuracy)] * 3
    assert summary["wall_time_s"] > 0 and summary["dataset"] == "synthetic:test"
    # --against: the vote paired problem by problem with the earlier one
    now = [line["correct"] for line in lines]
    gained = sum(n and not e for n, e in zip(now, earlier, strict=True))
    lost = sum(e and not n for n, e in zip(now, earlier, strict=True))
    assert summary["against"] == {
        "before": str(against),
        "num_problems": 6,
        "accuracy_before": 0.5,
        "accuracy_after": pytest.approx(accuracy),
        "gained": gained,
        "lost": lost,
        "p_value": sign_test_p_value(gained, lost),
    }

    inference = yaml.safe_load((output_dir / "inference_config.yaml").read_text())
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
    # both problems wrong before: whatever is right now was gained
    earlier = write_earlier_eval(tmp_path / "earlier", {"two.jsonl:1": False, "two.jsonl:2": False})
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
            "--against",  # passed on to `satseq eval` as it is
            str(earlier),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, SATSEQ=str(ROOT / ".venv/bin/satseq")),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "team" in result.stdout and "a0" in result.stdout
    predictions = read_predictions(out)
    assert [line["problem_id"] for line in predictions] == ["two.jsonl:1", "two.jsonl:2"]
    right = sum(line["correct"] for line in predictions)
    accuracy = json.loads((out / "summary.json").read_text())["team_vote_accuracy"]
    paired = f"team vote 0.000 → {accuracy:.3f} on 2 problems: {right} gained, 0 lost"
    assert paired in result.stdout


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

    result = runner.invoke(
        app, ["eval", "--dataset", "synthetic:test", *common, "--against", str(tmp_path / "no")]
    )
    assert result.exit_code == 2 and "no/predictions.jsonl does not exist" in result.output
    # an earlier eval of other problems: 6 of the 8 held-out ones asked here
    earlier = write_earlier_eval(tmp_path / "six", held_out_ids([True] * 6))
    eight = ["--set", "eval.synthetic_problems=8", "--against", str(earlier)]
    result = runner.invoke(app, ["eval", "--dataset", "synthetic:test", *common, *eight])
    assert result.exit_code == 2 and "holds other problems than this evaluation" in result.output
    assert "0 only there" in result.output and "2 only here" in result.output
    assert not (tmp_path / "summary.json").exists()  # nothing started, nothing written
