"""`merge`: estimate results -> {prompt: [scores]}, with what went wrong reported, not hidden."""

import json

import pytest
from typer.testing import CliRunner

from satseq.cli.main import app
from satseq.data import DataError
from satseq.offline import load_offline_values, merge_offline_values


def write_subset_results(input_dir, index, rows):
    """Rows as `estimate --exp_name offline_value_estimation_subset_<index>` lays them out."""
    path = input_dir / f"offline_value_estimation_subset_{index}" / "validation_data" / "0.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def rows(prompt, scores, answer="1", first_index=0):
    return [
        {"prompt": prompt, "score": score, "answer": answer, "sample_index": first_index + k}
        for k, score in enumerate(scores)
    ]


def test_scores_are_grouped_by_prompt_across_subsets(tmp_path):
    write_subset_results(
        tmp_path, 0, rows("What is 0 + 1?", [1, 0, 1]) + rows("What is 5 - 4?", [0])
    )
    write_subset_results(tmp_path, 1, rows("What is 3 - 2?", [1, 1]))
    report = merge_offline_values(tmp_path, tmp_path / "values.json")
    expected = {
        "What is 0 + 1?": [1.0, 0.0, 1.0],
        "What is 5 - 4?": [0.0],
        "What is 3 - 2?": [1.0, 1.0],
    }
    assert load_offline_values(tmp_path / "values.json") == expected
    assert (len(report.files), report.num_rows) == (2, 6)
    assert report.warning_lines() == []


def test_dataset_prompts_without_scores_are_reported(tmp_path):
    dataset = tmp_path / "train.jsonl"
    problems = ["What is 0 + 1?", "What is 3 - 2?", "What is 7 - 6?"]
    dataset.write_text("".join(json.dumps({"problem": p, "answer": "1"}) + "\n" for p in problems))
    write_subset_results(tmp_path, 0, rows("What is 0 + 1?", [1]) + rows("Not in the dataset", [0]))
    write_subset_results(tmp_path, 1, rows("What is 3 - 2?", [0]))
    report = merge_offline_values(tmp_path, tmp_path / "values.json", dataset=dataset)
    assert report.missing_prompts == ["What is 7 - 6?"]
    assert report.num_unknown_prompts == 1
    assert (
        "dataset prompts with no offline scores: 1 (they get the 0.5/0.5 prior): 'What is 7 - 6?'"
        in report.warning_lines()
    )
    assert "merged prompts not in the dataset: 1" in report.warning_lines()


def test_duplicate_rows_count_once(tmp_path):
    first = write_subset_results(tmp_path, 0, rows("What is 0 + 1?", [1, 0]))
    # The same subset's results copied under a second name, plus one new row.
    second = write_subset_results(
        tmp_path, 1, rows("What is 0 + 1?", [1, 0]) + rows("What is 2 - 1?", [1])
    )
    report = merge_offline_values(tmp_path, tmp_path / "values.json")
    assert report.values == {"What is 0 + 1?": [1.0, 0.0], "What is 2 - 1?": [1.0]}
    assert report.duplicate_rows == [(f"{second}:1", f"{first}:1"), (f"{second}:2", f"{first}:2")]
    assert report.files_of_shared_prompts == {}  # only duplicates of it were in the second file
    assert report.warning_lines()[0].startswith(
        f"duplicate rows: 2, counted once (the first: {second}:1"
    )


def test_equal_rows_without_a_sample_identity_are_each_a_score(tmp_path):
    """8 samples of one prompt that all scored 1, from a tool that writes no sample_index, are
    8 observations: merging them into one would turn the prior's n0 = 8 into n0 = 1."""
    same = [{"prompt": "What is 0 + 1?", "score": 1}] * 8
    write_subset_results(tmp_path, 0, same)
    report = merge_offline_values(tmp_path, tmp_path / "values.json")
    assert report.values == {"What is 0 + 1?": [1.0] * 8}
    assert report.duplicate_rows == [] and report.duplicate_files == []


def test_a_file_seen_twice_counts_once_and_is_reported(tmp_path):
    same = [{"prompt": "What is 0 + 1?", "score": 1}] * 3
    first = write_subset_results(tmp_path, 0, same)
    second = write_subset_results(tmp_path, 1, same)
    report = merge_offline_values(tmp_path, tmp_path / "values.json")
    assert report.values == {"What is 0 + 1?": [1.0] * 3}
    assert report.duplicate_files == [(second, first)]
    assert report.warning_lines()[0] == (
        f"duplicate files: 1, counted once (the first: {second} repeats {first})"
    )


def test_a_prompt_in_two_subsets_pools_its_scores_and_is_reported(tmp_path):
    first = write_subset_results(tmp_path, 0, rows("What is 0 + 1?", [1, 1]))
    second = write_subset_results(tmp_path, 1, rows("What is 0 + 1?", [0], first_index=2))
    report = merge_offline_values(tmp_path, tmp_path / "values.json")
    assert report.values == {"What is 0 + 1?": [1.0, 1.0, 0.0]}
    assert report.files_of_shared_prompts == {"What is 0 + 1?": [first, second]}
    assert report.warning_lines() == [
        "prompts in more than one file: 1, scores pooled "
        f"(e.g. 'What is 0 + 1?' in {first}, {second})"
    ]


def test_a_prompt_with_two_reference_answers_is_a_conflict(tmp_path):
    write_subset_results(tmp_path, 0, rows("Solve x^2 = 4.", [1], answer="2"))
    write_subset_results(tmp_path, 1, rows("Solve x^2 = 4.", [0], answer="-2"))
    report = merge_offline_values(tmp_path, tmp_path / "values.json")
    assert report.conflicting_answers == {"Solve x^2 = 4.": ["2", "-2"]}
    assert (
        "prompts with conflicting answers: 1, scores pooled "
        "(e.g. 'Solve x^2 = 4.': answers '2', '-2')" in report.warning_lines()
    )


def test_scores_beyond_the_cap_are_subsampled_with_the_seed(tmp_path):
    scores = [k / 19 for k in range(20)]  # distinct, so that which were kept is visible
    write_subset_results(
        tmp_path, 0, rows("What is 9 - 8?", scores) + rows("What is 1 * 1?", [1, 0])
    )

    def merged(seed, name):
        report = merge_offline_values(tmp_path, tmp_path / name, max_scores_per_prompt=8, seed=seed)
        return report, (tmp_path / name).read_bytes()

    report, first = merged(0, "a.json")
    kept = report.values["What is 9 - 8?"]
    assert len(kept) == 8 and len(set(kept)) == 8 and set(kept) <= set(scores)
    assert report.values["What is 1 * 1?"] == [1.0, 0.0]  # under the cap: kept as they are
    assert report.num_subsampled == 1
    assert merged(0, "b.json")[1] == first
    assert merged(1, "c.json")[1] != first


@pytest.mark.parametrize(
    ("second_line", "message"),
    [
        ('{"prompt": "What is 1 + 2?", "score": 1', "not valid JSON|invalid JSON"),
        ('["What is 1 + 2?", 1]', "expected a JSON object, got list"),
        ('{"score": 1}', "needs a non-empty text field 'prompt'"),
        (
            '{"input": "user\\nWhat is 1 + 2?\\nassistant", "score": 1}',
            "seeds' eval has only the rendered `input`",
        ),
        ('{"prompt": "What is 1 + 2?", "score": "1"}', "'score' is \"1\", not a finite number"),
        ('{"prompt": "What is 1 + 2?"}', "'score' is null, not a finite number"),
    ],
)
def test_a_bad_row_is_named_by_file_and_line(tmp_path, second_line, message):
    path = write_subset_results(tmp_path, 0, rows("What is 0 + 1?", [1]))
    path.write_text(path.read_text() + second_line + "\n")
    with pytest.raises(DataError, match=message) as error:
        merge_offline_values(tmp_path, tmp_path / "values.json")
    assert str(error.value).startswith(f"{path}:2: ")
    assert not (tmp_path / "values.json").exists()


def test_no_matching_files_names_the_pattern(tmp_path):
    write_subset_results(tmp_path, 0, rows("What is 0 + 1?", [1]))
    with pytest.raises(DataError, match=r"no files match .*/other_\*/0\.jsonl"):
        merge_offline_values(tmp_path, tmp_path / "values.json", pattern="other_*/0.jsonl")
    with pytest.raises(DataError, match="max_scores_per_prompt must be >= 1"):
        merge_offline_values(tmp_path, tmp_path / "values.json", max_scores_per_prompt=0)


def test_subset_10_is_read_after_subset_9(tmp_path):
    for index in (10, 9, 2):
        write_subset_results(tmp_path, index, rows(f"What is {index} - {index}?", [1]))
    report = merge_offline_values(tmp_path, tmp_path / "values.json")
    assert [path.parts[-3] for path in report.files] == [
        f"offline_value_estimation_subset_{index}" for index in (2, 9, 10)
    ]


def test_the_cli_prints_statistics_with_the_seeds_flags(tmp_path):
    write_subset_results(
        tmp_path, 0, rows("What is 0 + 1?", [1, 0, 1, 1]) + rows("What is 5 - 4?", [0, 0])
    )
    output = tmp_path / "out" / "values.json"
    result = CliRunner().invoke(
        app,
        [
            "offline-values",
            "merge",
            "--input_dir",
            str(tmp_path),
            "--output_file",
            str(output),
            "--max_scores_per_prompt",
            "3",
            "--seed",
            "7",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "prompts: 2" in result.output
    assert (
        "scores per prompt: min 2, mean 2.50, max 3 (cap 3; 1 prompts subsampled to it)"
        in result.output
    )
    assert "mean score: " in result.output
    assert sorted(len(scores) for scores in load_offline_values(output).values()) == [2, 3]


def test_the_cli_reports_a_bad_row_without_a_traceback(tmp_path):
    path = write_subset_results(tmp_path, 0, [{"prompt": "What is 0 + 1?", "score": "yes"}])
    result = CliRunner().invoke(
        app,
        [
            "offline-values",
            "merge",
            "--input-dir",
            str(tmp_path),
            "--output-file",
            str(tmp_path / "v.json"),
        ],
    )
    assert result.exit_code == 2
    assert f"{path}:1: 'score' is \"yes\"" in result.output
    assert "Traceback" not in result.output
