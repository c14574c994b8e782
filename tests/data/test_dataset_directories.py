"""Dataset directories (`save_to_disk` output, a dataset's files as on the Hub), verl's parquet
files, and lists of sources: each made here by the real `datasets` and pyarrow, read offline."""

import datasets
import pytest

from satseq.data import DataError, load_problems
from tests.data.test_data_loaders import write_jsonl, write_parquet

PLAIN_ROWS = [{"problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(4)]


def verl_row(index, question, answer, split="train"):
    """A row as verl's examples/data_preprocess/gsm8k.py writes it."""
    return {
        "data_source": "openai/gsm8k",
        "prompt": [
            {
                "role": "user",
                "content": f"{question} Let's think step by step and output the final answer "
                'after "####".',
            }
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": f"#### {answer}"},
    }


def test_verl_parquet_files_are_read_as_they_are_from_a_list(tmp_path):
    """verl's `data.train_files`: a list of parquet files with its columns, an int index."""
    first = write_parquet(tmp_path / "gsm8k_a.parquet", [verl_row(0, "Is 2 even?", "1")])
    second = write_parquet(tmp_path / "gsm8k_b.parquet", [verl_row(7, "What is 3*3?", "9")])
    loaded = load_problems([str(first), str(second)])
    assert loaded.format_name == "verl (DAPO-Math-17k)"
    assert [(p.problem_id, p.answer) for p in loaded] == [("0", "1"), ("7", "9")]
    assert loaded.problems[1].problem.startswith("What is 3*3? Let's think step by step")
    assert loaded.problems[1].meta == {"data_source": "openai/gsm8k", "ability": "math"}
    assert loaded.source == f"{first}, {second}"


def test_a_list_detects_each_sources_format_and_names_the_bad_file(tmp_path):
    verl = write_parquet(tmp_path / "verl.parquet", [verl_row(0, "Is 2 even?", "1")])
    plain = write_jsonl(tmp_path / "plain.jsonl", PLAIN_ROWS[:2])
    loaded = load_problems([verl, plain])
    assert loaded.format_name == "verl (DAPO-Math-17k), {problem, answer}"
    assert [p.answer for p in loaded] == ["1", "1", "2"]
    broken = write_jsonl(tmp_path / "broken.jsonl", [PLAIN_ROWS[0], '{"problem": "x"}'])
    with pytest.raises(DataError, match=rf"^{broken}:2: missing field 'answer'"):
        load_problems([verl, broken])
    with pytest.raises(DataError, match="no data sources"):
        load_problems([])


def test_save_to_disk_output_is_read_with_its_split(tmp_path):
    dataset = datasets.Dataset.from_list(PLAIN_ROWS)
    dataset.save_to_disk(tmp_path / "one")
    assert [p.answer for p in load_problems(tmp_path / "one")] == ["1", "2", "3", "4"]
    splits = datasets.DatasetDict({"train": dataset.select(range(3)), "test": dataset.select([3])})
    splits.save_to_disk(tmp_path / "both")
    assert [p.answer for p in load_problems(tmp_path / "both", split="test")] == ["4"]
    assert [p.answer for p in load_problems(tmp_path / "both" / "test")] == ["4"]  # one split
    with pytest.raises(DataError, match=r"both: no 'validation' split; .* \['test', 'train'\]"):
        load_problems(tmp_path / "both", split="validation")


def test_a_bad_row_of_a_saved_dataset_names_the_directory_split_and_row(tmp_path):
    rows = [*PLAIN_ROWS[:2], {"problem": "What is 0+0?", "answer": None}]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(tmp_path / "d")
    with pytest.raises(DataError, match=rf"^{tmp_path / 'd'}\[train\]:row 2: missing field"):
        load_problems(tmp_path / "d")


def test_a_hub_layout_reads_the_files_of_the_split(tmp_path):
    """The layout `push_to_hub` writes: data/<split>-<shard>-of-<n>.parquet."""
    data = tmp_path / "hub" / "data"
    data.mkdir(parents=True)
    write_parquet(data / "train-00000-of-00002.parquet", PLAIN_ROWS[:1])
    write_parquet(data / "train-00001-of-00002.parquet", PLAIN_ROWS[1:3])
    write_parquet(data / "test-00000-of-00001.parquet", PLAIN_ROWS[3:])
    assert [p.answer for p in load_problems(tmp_path / "hub")] == ["1", "2", "3"]
    assert [p.answer for p in load_problems(tmp_path / "hub", split="test")] == ["4"]


def test_split_named_files_do_not_mix(tmp_path):
    """train.jsonl and test.jsonl side by side: training reads train.jsonl only."""
    write_jsonl(tmp_path / "train.jsonl", PLAIN_ROWS[:3])
    write_jsonl(tmp_path / "test.jsonl", [*PLAIN_ROWS[3:], '{"problem": "bad"'])
    assert [p.answer for p in load_problems(tmp_path)] == ["1", "2", "3"]
    with pytest.raises(DataError, match=rf"^{tmp_path / 'test.jsonl'}:2: invalid JSON"):
        load_problems(tmp_path, split="test")


def test_a_readme_config_is_named_after_a_colon(tmp_path):
    (tmp_path / "easy").mkdir()
    (tmp_path / "hard").mkdir()
    write_jsonl(tmp_path / "easy" / "part.jsonl", PLAIN_ROWS[:1])
    write_jsonl(tmp_path / "hard" / "part.jsonl", PLAIN_ROWS[1:])
    (tmp_path / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: easy\n  data_files: easy/*.jsonl\n"
        "- config_name: hard\n  data_files: hard/*.jsonl\n---\n# Two configs\n"
    )
    assert [p.answer for p in load_problems(f"{tmp_path}:hard")] == ["2", "3", "4"]
    with pytest.raises(DataError, match=rf"{tmp_path}: .*easy.*hard.*name a config as"):
        load_problems(tmp_path)


def test_a_directory_of_both_file_types_is_refused_not_half_read(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", PLAIN_ROWS[:1])
    write_jsonl(tmp_path / "b.jsonl", PLAIN_ROWS[1:2])
    write_parquet(tmp_path / "c.parquet", PLAIN_ROWS[2:])
    with pytest.raises(DataError, match=rf"{tmp_path}: holds both .jsonl and .parquet files"):
        load_problems(tmp_path)
