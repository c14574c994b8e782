"""Splitting problems into contiguous subsets and the subset_<i>.parquet round trip."""

import json

import pytest

from satseq.data import (
    DataError,
    MathProblem,
    load_problems,
    make_split,
    split_problems,
    write_subsets,
)


def numbered_problems(count):
    return [MathProblem(f"p{i}", f"What is {i} + 1?", str(i + 1)) for i in range(count)]


def test_subsets_are_contiguous_and_the_first_ones_take_the_remainder():
    problems = numbered_problems(10)
    subsets = split_problems(problems, 3)
    assert [[p.problem_id for p in subset] for subset in subsets] == [
        ["p0", "p1", "p2", "p3"],
        ["p4", "p5", "p6"],
        ["p7", "p8", "p9"],
    ]


def test_written_subsets_load_back_to_the_same_problems(tmp_path):
    problems = make_split("train", 25, seed=1, difficulty=4, solution_format="tool")
    paths = write_subsets(problems, tmp_path / "subsets", num_subsets=4)
    assert [path.name for path in paths] == [f"subset_{i}.parquet" for i in range(4)]
    loaded = [load_problems(path) for path in paths]
    assert [len(subset) for subset in loaded] == [7, 6, 6, 6]
    assert [problem for subset in loaded for problem in subset] == problems
    assert load_problems(tmp_path / "subsets").problems == problems  # the seeds' TRAIN_DATA_DIR


def test_a_source_file_is_loaded_then_split(tmp_path):
    source = tmp_path / "train.jsonl"
    rows = [{"problem": f"What is {i} * 2?", "answer": str(2 * i), "level": i} for i in range(5)]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    paths = write_subsets(source, tmp_path / "out", num_subsets=2)
    reloaded = [problem for path in paths for problem in load_problems(path)]
    assert reloaded == load_problems(source).problems
    assert reloaded[3] == MathProblem("train.jsonl:4", "What is 3 * 2?", "6", meta={"level": 3})


@pytest.mark.parametrize(
    ("count", "num_subsets", "message"),
    [
        (0, 2, "nothing to split"),
        (5, 0, "number of subsets must be >= 1"),
        (3, 5, "cannot split 3 problems into 5 subsets.*at most 3"),
    ],
)
def test_impossible_splits_say_why(count, num_subsets, message):
    with pytest.raises(DataError, match=message):
        split_problems(numbered_problems(count), num_subsets)


def test_a_missing_source_is_named(tmp_path):
    with pytest.raises(DataError, match=r"absent\.parquet: file not found"):
        write_subsets(tmp_path / "absent.parquet", tmp_path / "out", num_subsets=2)


def test_leftover_subsets_of_an_earlier_split_are_not_mixed_in(tmp_path):
    write_subsets(numbered_problems(6), tmp_path, num_subsets=3)
    write_subsets(numbered_problems(6), tmp_path, num_subsets=3)  # same layout: overwritten
    with pytest.raises(DataError, match=r"subset_2.parquet\); remove them"):
        write_subsets(numbered_problems(6), tmp_path, num_subsets=2)
