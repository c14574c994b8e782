"""`split`: a dataset becomes subset_<i>.parquet files that load back to the same problems."""

import json

from typer.testing import CliRunner

from satseq.cli.main import app
from satseq.data import load_problems, make_split
from satseq.offline import split_dataset


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_subsets_load_back_to_the_dataset_in_order(tmp_path):
    problems = make_split("test", 11, seed=3, difficulty=2, style="words")
    source = write_jsonl(
        tmp_path / "train.jsonl", [{"problem": p.problem, "answer": p.answer} for p in problems]
    )
    report = split_dataset(source, tmp_path / "splits", num_subsets=3)
    assert [path.name for path in report.paths] == [f"subset_{i}.parquet" for i in range(3)]
    assert report.sizes == [4, 4, 3]
    assert report.format_name == "{problem, answer}"
    reloaded = [problem for path in report.paths for problem in load_problems(path)]
    assert reloaded == load_problems(source).problems
    assert [p.problem for p in reloaded] == [p.problem for p in problems]


def test_the_cli_uses_the_seeds_flags_and_reports_skipped_rows(tmp_path):
    source = write_jsonl(
        tmp_path / "train.jsonl",
        [{"problem": "What is 1 + 1?", "answer": "2"}, {"problem": "What is 2 + 2?"}]
        + [{"problem": f"What is {k} * 2?", "answer": str(2 * k)} for k in range(3)],
    )
    args = ["offline-values", "split", "--dataset", str(source), "--output_dir"]
    args += [str(tmp_path / "out"), "--num_subsets", "2", "--set", "data.skip_bad_rows=true"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"{tmp_path / 'out' / 'subset_0.parquet'}: 2 problems" in result.output
    assert f"{tmp_path / 'out' / 'subset_1.parquet'}: 2 problems" in result.output
    assert f"skipped {source}:2: missing field 'answer'" in result.output


def test_the_cli_names_a_bad_row_and_exits_2(tmp_path):
    rows = [{"problem": "What is 1 + 1?", "answer": "2"}, {"problem": "What is 2 + 2?"}]
    source = write_jsonl(tmp_path / "train.jsonl", rows)
    args = ["offline-values", "split", "--dataset", str(source), "--output_dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert f"{source}:2: missing field 'answer'" in result.output
    assert not list(tmp_path.glob("subset_*.parquet"))
