"""`estimate` on the real runtime (RolloutActors on a local Ray, the embedded tiny models, the
training reward, the sandbox for tool calls), in the split -> estimate -> merge chain of the CLI."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from satseq.cli.main import app
from satseq.data import DataError, make_split
from satseq.offline import estimate_offline_values, load_offline_values

TOOLS_CONFIG = Path(__file__).parents[2] / "configs" / "quickstart_tools.yaml"


def write_problems(path, problems):
    path.write_text(
        "".join(json.dumps({"problem": p.problem, "answer": p.answer}) + "\n" for p in problems)
    )
    return path


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    ("n_samples", "chunk_size", "message"),
    [(0, 8, "n_samples must be >= 1, got 0"), (2, 0, "chunk_size must be >= 1, got 0")],
)
def test_bad_settings_fail_before_any_sampling(tmp_path, n_samples, chunk_size, message):
    data_file = write_problems(tmp_path / "p.jsonl", make_split("test", 2, seed=0))
    with pytest.raises(DataError, match=message):
        estimate_offline_values(
            data_file, "builtin:tiny", tmp_path, n_samples, chunk_size=chunk_size
        )
    assert not any(tmp_path.glob("**/0.jsonl"))


@pytest.mark.slow
def test_split_estimate_merge_chain_through_the_cli(ray_cluster, tmp_path):
    problems = make_split("test", 6, seed=1, difficulty=1, style="symbols")
    dataset = write_problems(tmp_path / "train.jsonl", problems)
    estimates = tmp_path / "estimates"
    runner = CliRunner()

    def satseq(*args):
        result = runner.invoke(app, ["offline-values", *map(str, args)])
        assert result.exit_code == 0, result.output
        return result.output

    satseq("split", "--dataset", dataset, "--output_dir", tmp_path / "splits", "--num_subsets", 2)
    # Subset 0: named as in the seeds' README, spread over two rollout actors in chunks of 2
    # prompts, asked with a system prompt (so the rendered prompt is far from the raw text).
    output = satseq(
        "estimate", "--data_file", tmp_path / "splits/subset_0.parquet",
        "--model_path", "builtin:tiny", "--output_dir", estimates, "--n_samples", 3,
        "--exp_name", "offline_value_estimation_subset_0", "--chunk_size", 2,
        "--set", "rollout.max_new_tokens=32", "--set", "rollout.num_actors=2",
        "--set", "data.prompt.system_prompt=Answer briefly.",
    )  # fmt: skip
    assert "2/3 prompts" in output and "3/3 prompts" in output
    assert "prompts: 3, samples per prompt: 3" in output
    rows = read_jsonl(estimates / "offline_value_estimation_subset_0/validation_data/0.jsonl")
    assert [row["prompt"] for row in rows] == [p.problem for p in problems[:3] for _ in range(3)]
    assert [row["answer"] for row in rows] == [p.answer for p in problems[:3] for _ in range(3)]
    assert [row["sample_index"] for row in rows] == [0, 1, 2] * 3
    assert {row["score"] for row in rows} <= {0.0, 1.0}
    assert all(row["response_tokens"] <= 32 for row in rows)
    mean_score = sum(row["score"] for row in rows) / len(rows)
    assert f"mean score: {mean_score:.4f}" in output
    # Subset 1: no --exp_name (the subset_<i> file name gives the layout merge expects), and
    # tool-augmented: the tool-trained tiny model's code runs in the local sandbox.
    output = satseq(
        "estimate", "--data_file", tmp_path / "splits/subset_1.parquet",
        "--model_path", "builtin:tiny-tool", "--output_dir", estimates, "--n_samples", 3,
        "--config", TOOLS_CONFIG,
    )  # fmt: skip
    results = estimates / "offline_value_estimation_subset_1/validation_data/0.jsonl"
    assert f"wrote {results}" in output
    rows = read_jsonl(results)
    assert [row["prompt"] for row in rows] == [p.problem for p in problems[3:] for _ in range(3)]
    assert any(row["tool_calls"] > 0 and "<interpreter>" in row["response"] for row in rows)

    output = satseq(
        "merge", "--input_dir", estimates, "--output_file", tmp_path / "values.json",
        "--dataset", dataset, "--max_scores_per_prompt", 2,
    )  # fmt: skip
    assert "files: 2" in output and "prompts: 6" in output
    assert "no offline scores" not in output  # every dataset prompt was estimated
    values = load_offline_values(tmp_path / "values.json")
    assert list(values) == [p.problem for p in problems]
    assert all(len(scores) == 2 and set(scores) <= {0.0, 1.0} for scores in values.values())
