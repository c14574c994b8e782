"""Loading problems from JSONL, parquet and (faked) Hub datasets in the four known formats."""

import json
import sys
import types
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from satseq.data import DataError, MathProblem, load_problems
from satseq.data.formats import DAPO_INSTRUCTION_PREFIX, DAPO_INSTRUCTION_SUFFIX

SEED_ROWS = [
    {"prompt": "What is 2+2?", "chosen": "2+2=4, so \\boxed{4}", "rejected": "\\boxed{5}"},
    {"prompt": "Name the first prime.", "chosen": " 2 \n", "rejected": "1"},
]
PROBLEM_ANSWER_ROWS = [
    {"problem": "What is 6*7?", "answer": "42"},
    {"problem": "Simplify 2/4.", "answer": "\\frac{1}{2}"},
]
DAPO_ROWS = [
    {
        "data_source": "math_dapo",
        "prompt": [
            {
                "role": "user",
                "content": DAPO_INSTRUCTION_PREFIX
                + "Find $x$ if $x+1=35$."
                + DAPO_INSTRUCTION_SUFFIX,
            }
        ],
        "ability": "MATH",
        "reward_model": {"ground_truth": "34", "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"},
    },
    {
        "data_source": "math_dapo",
        "prompt": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "How many primes are below 10?"},
        ],
        "ability": "MATH",
        "reward_model": {"ground_truth": "4", "style": "rule"},
        "extra_info": {"index": "2"},
    },
]
MATH_500_ROWS = [
    {
        "problem": "Compute $\\dbinom{4}{2}$.",
        "solution": "$\\dbinom{4}{2} = 6$, so the answer is $\\boxed{6}$.",
        "answer": "6",
        "subject": "Counting & Probability",
        "level": 1,
        "unique_id": "test/counting_and_probability/1.json",
    },
]

# An empty problem_id stands for the default id, which depends on the file (see with_default_ids).
EXPECTED = {
    "{prompt, chosen, rejected}": [
        MathProblem(
            "",
            "What is 2+2?",
            "4",
            solution="2+2=4, so \\boxed{4}",
            meta={"rejected": "\\boxed{5}"},
        ),
        MathProblem("", "Name the first prime.", "2", meta={"rejected": "1"}),
    ],
    "{problem, answer}": [
        MathProblem("", "What is 6*7?", "42"),
        MathProblem("", "Simplify 2/4.", "\\frac{1}{2}"),
    ],
    "verl (DAPO-Math-17k)": [
        MathProblem(
            "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079",
            "Find $x$ if $x+1=35$.",
            "34",
            meta={"data_source": "math_dapo", "ability": "MATH"},
        ),
        MathProblem(
            "2",
            "How many primes are below 10?",
            "4",
            meta={"data_source": "math_dapo", "ability": "MATH"},
        ),
    ],
    "MATH-500": [
        MathProblem(
            "test/counting_and_probability/1.json",
            "Compute $\\dbinom{4}{2}$.",
            "6",
            solution="$\\dbinom{4}{2} = 6$, so the answer is $\\boxed{6}$.",
            meta={"subject": "Counting & Probability", "level": 1},
        )
    ],
}
FORMAT_FILES = {
    "{prompt, chosen, rejected}": ("seed", SEED_ROWS),
    "{problem, answer}": ("plain", PROBLEM_ANSWER_ROWS),
    "verl (DAPO-Math-17k)": ("dapo", DAPO_ROWS),
    "MATH-500": ("math500", MATH_500_ROWS),
}


def write_jsonl(path, rows):
    """Write rows (dicts, or raw strings for malformed lines) one a line."""
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_fixture(tmp_path, stem, rows, suffix):
    path = tmp_path / f"{stem}{suffix}"
    return write_jsonl(path, rows) if suffix == ".jsonl" else write_parquet(path, rows)


def with_default_ids(problems, path):
    """Fill in the ids of rows that have none: file name and line (JSONL) or row index."""
    return [
        problem
        if problem.problem_id
        else replace(
            problem, problem_id=f"{path.name}:{line if path.suffix == '.jsonl' else line - 1}"
        )
        for line, problem in enumerate(problems, start=1)
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("format_name", sorted(FORMAT_FILES))
def test_each_known_format_is_detected_and_mapped(tmp_path, format_name, suffix):
    stem, rows = FORMAT_FILES[format_name]
    path = write_fixture(tmp_path, stem, rows, suffix)
    loaded = load_problems(path)
    assert loaded.format_name == format_name
    assert loaded.num_skipped == 0
    assert list(loaded) == with_default_ids(EXPECTED[format_name], path)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_an_explicit_field_map_reads_dotted_paths(tmp_path, suffix):
    rows = [
        {"question": "What is 1+1?", "reward_model": {"ground_truth": "2"}, "id": "q1"},
        {"question": "What is 2+3?", "reward_model": {"ground_truth": "5"}, "id": "q2"},
    ]
    path = write_fixture(tmp_path, "custom", rows, suffix)
    field_map = {"problem": "question", "answer": "reward_model.ground_truth", "problem_id": "id"}
    loaded = load_problems(path, field_map=field_map)
    assert [(p.problem_id, p.problem, p.answer) for p in loaded] == [
        ("q1", "What is 1+1?", "2"),
        ("q2", "What is 2+3?", "5"),
    ]
    assert loaded.format_name.startswith("field map {problem: question")


def test_a_field_map_may_name_only_the_fields_that_differ(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "What is 3-1?", "answer": "2"}])
    [problem] = load_problems(path, field_map={"problem": "question"})
    assert (problem.problem, problem.answer) == ("What is 3-1?", "2")


def test_numeric_answers_become_text(tmp_path):
    rows = [{"problem": "What is 6*7?", "answer": 42}, {"problem": "Half of 1?", "answer": 0.5}]
    path = write_jsonl(tmp_path / "numeric.jsonl", rows)
    assert [p.answer for p in load_problems(path)] == ["42", "0.5"]


def test_an_unknown_field_map_key_lists_the_valid_keys(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", PROBLEM_ANSWER_ROWS)
    with pytest.raises(DataError, match=r"unknown field map key\(s\) \['question'\].*'problem'"):
        load_problems(path, field_map={"question": "problem"})


BAD_LINES = [
    ('{"problem": "What is 1+1?", "answer": ', "invalid JSON"),
    ('{"problem": "What is 1+1?"}', "missing field 'answer' (format {problem, answer})"),
    ('{"problem": "   ", "answer": "2"}', "field 'problem' is an empty problem"),
    ('{"problem": "What is 1+1?", "answer": [2]}', "field 'answer' must be text or a number"),
    ('{"problem": "What is 1+1?", "answer": true}', "field 'answer' must be text or a number"),
    ('["What is 1+1?", "2"]', "expected a JSON object, got list"),
]


@pytest.mark.parametrize(("bad_line", "reason"), BAD_LINES)
def test_a_bad_row_is_reported_with_file_and_line(tmp_path, bad_line, reason):
    # The blank line 2 still counts, so the bad row is line 3 as an editor shows it.
    path = write_jsonl(tmp_path / "train.jsonl", [PROBLEM_ANSWER_ROWS[0], "", bad_line])
    with pytest.raises(DataError) as error:
        load_problems(path)
    message = str(error.value)
    assert message.startswith(f"{path}:3: ")
    assert reason in message
    assert "skip_bad_rows=True" in message


def test_a_line_that_is_not_utf8_is_a_bad_row(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        '{"problem": "Combien font 2+2 ?", "answer": "4", "note": "é"}\n'.encode("latin-1")
    )
    with pytest.raises(DataError, match=rf"^{path}:1: not valid UTF-8 text"):
        load_problems(path)


def test_skip_bad_rows_keeps_the_good_rows_and_counts_the_others(tmp_path):
    rows = [PROBLEM_ANSWER_ROWS[0], *(line for line, _ in BAD_LINES), PROBLEM_ANSWER_ROWS[1]]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    loaded = load_problems(path, skip_bad_rows=True)
    assert [p.answer for p in loaded] == ["42", "\\frac{1}{2}"]
    assert loaded.num_skipped == len(BAD_LINES)
    assert [message.split(": ")[0] for message in loaded.skipped_rows] == [
        f"{path}:{line}" for line in range(2, 2 + len(BAD_LINES))
    ]


def test_a_bad_parquet_row_is_reported_by_row_index(tmp_path):
    rows = [{"problem": "What is 1+1?", "answer": "2"}, {"problem": "What is 2+2?", "answer": None}]
    path = write_parquet(tmp_path / "train.parquet", rows)
    with pytest.raises(DataError, match=rf"^{path}:row 1: missing field 'answer'"):
        load_problems(path)
    assert load_problems(path, skip_bad_rows=True).num_skipped == 1


def test_a_seed_row_with_an_empty_boxed_answer_is_bad(tmp_path):
    path = write_jsonl(tmp_path / "seed.jsonl", [{"prompt": "Q?", "chosen": "\\boxed{ }"}])
    with pytest.raises(DataError, match="empty \\\\boxed"):
        load_problems(path)


def test_an_unknown_layout_asks_for_a_field_map(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [{"question": "Q?", "label": "1"}])
    with pytest.raises(DataError, match=rf"{path}:1: cannot tell the dataset format.*field map"):
        load_problems(path)


def test_a_file_of_only_bad_rows_loads_nothing_and_says_so(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", ["{", "{"])
    with pytest.raises(DataError, match=r"no problems to load; all 2 rows were bad"):
        load_problems(path, skip_bad_rows=True)


def test_an_empty_file_is_named(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: no rows; the dataset is empty"):
        load_problems(path)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing.jsonl", "file not found"),
        ("notes.csv", "unsupported file type '.csv'"),
    ],
)
def test_bad_local_paths_are_named(tmp_path, name, message):
    path = tmp_path / name
    if name.endswith(".csv"):
        path.write_text("problem,answer\n")
    with pytest.raises(DataError, match=message):
        load_problems(path)


def test_a_corrupt_parquet_file_is_named(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=rf"{path}: cannot read as parquet"):
        load_problems(path)


def fake_datasets_module(monkeypatch, load_dataset):
    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)


def test_a_hub_name_without_the_datasets_library_says_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(
        DataError, match=r"HuggingFaceH4/MATH-500.*`datasets` library, which is not inst"
    ):
        load_problems("HuggingFaceH4/MATH-500", split="test")


def test_a_hub_dataset_that_cannot_be_fetched_is_named_with_the_cause(monkeypatch):
    def offline(name, config, split):
        raise ConnectionError("Couldn't reach 'HuggingFaceH4/MATH-500' on the Hub")

    fake_datasets_module(monkeypatch, offline)
    with pytest.raises(DataError) as error:
        load_problems("HuggingFaceH4/MATH-500", split="test")
    message = str(error.value)
    assert "cannot load Hugging Face dataset 'HuggingFaceH4/MATH-500' (split 'test')" in message
    assert "ConnectionError" in message
    assert "local .jsonl or .parquet" in message


def test_a_hub_dataset_is_read_like_a_file_with_config_and_split(monkeypatch):
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return [*MATH_500_ROWS, {"problem": "Q?", "answer": None, "unique_id": "x"}]

    fake_datasets_module(monkeypatch, load_dataset)
    loaded = load_problems("org/math:all", split="test", skip_bad_rows=True)
    assert calls == [("org/math", "all", "test")]
    assert list(loaded) == EXPECTED["MATH-500"]
    assert loaded.skipped_rows == ["org/math[test]:row 1: missing field 'answer' (format MATH-500)"]


def test_a_directory_reads_its_data_files_in_natural_order(tmp_path):
    """The seeds' TRAIN_DATA_DIR: a directory of subset files, subset_2 before subset_10."""
    problems = [MathProblem(f"p{i}", f"What is {i}+1?", str(i + 1)) for i in range(12)]
    for index, problem in enumerate(problems):
        write_jsonl(
            tmp_path / f"subset_{index}.jsonl",
            [{"problem": problem.problem, "answer": problem.answer}],
        )
    (tmp_path / "notes.txt").write_text("not data")
    loaded = load_problems(tmp_path)
    assert [p.problem for p in loaded.problems] == [p.problem for p in problems]
    assert loaded.problems[10].problem_id == "subset_10.jsonl:1"


def test_a_bad_row_in_a_directory_names_its_own_file(tmp_path):
    write_jsonl(tmp_path / "subset_0.jsonl", PROBLEM_ANSWER_ROWS)
    write_jsonl(tmp_path / "subset_1.jsonl", ['{"problem": "x"'])
    with pytest.raises(DataError, match=rf"{tmp_path / 'subset_1.jsonl'}:1: invalid JSON"):
        load_problems(tmp_path)


def test_a_directory_without_data_files_is_named(tmp_path):
    (tmp_path / "readme.md").write_text("nothing here")
    with pytest.raises(DataError, match=rf"{tmp_path}: a directory with no .jsonl or .parquet"):
        load_problems(tmp_path)
