"""The offline-values file the SPO trainer reads: `load_offline_values` and its errors."""

import json

import pytest

from satseq.data import DataError
from satseq.offline import load_offline_values, write_offline_values


def test_written_values_load_back_as_floats(tmp_path):
    path = write_offline_values(
        {"What is 1 + 1?": [1, 0, 1], "Compute 3 * 4.": [0.25]}, tmp_path / "v.json"
    )
    values = load_offline_values(path)
    assert values == {"What is 1 + 1?": [1.0, 0.0, 1.0], "Compute 3 * 4.": [0.25]}
    assert all(isinstance(score, float) for scores in values.values() for score in scores)


def test_a_missing_file_says_how_to_make_one(tmp_path):
    with pytest.raises(DataError, match=r"absent\.json: offline values file not found.*merge"):
        load_offline_values(tmp_path / "absent.json")


def test_invalid_json_names_the_line(tmp_path):
    path = tmp_path / "v.json"
    path.write_text('{\n "a": [1],\n "b": [0,,]\n}\n')
    with pytest.raises(DataError, match=r"v\.json:3: not valid JSON"):
        load_offline_values(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[["a", [1]]]', r"expected a JSON object \{prompt: \[scores\]\}, got list"),
        (
            '{"What is 2 + 2?": [1], "What is 2 + 2?": [0]}',
            r"prompt 'What is 2 \+ 2\?' is a key twice",
        ),
        ('{"  ": [1]}', "an empty prompt is a key"),
        ('{"What is 2 + 2?": 1}', r"prompt 'What is 2 \+ 2\?': expected a list of scores, got 1"),
        ('{"What is 2 + 2?": []}', r"prompt 'What is 2 \+ 2\?': has an empty list of scores"),
        (
            '{"What is 2 + 2?": [1, "0"]}',
            r"prompt 'What is 2 \+ 2\?': score 1 is \"0\", not a finite",
        ),
        ('{"What is 2 + 2?": [true]}', "score 0 is true, not a finite number"),
        ('{"What is 2 + 2?": [0, NaN]}', "score 1 is NaN, not a finite number"),
    ],
)
def test_bad_content_names_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "values.json"
    path.write_text(text)
    with pytest.raises(DataError, match=message) as error:
        load_offline_values(path)
    assert str(error.value).startswith(f"{path}:")


def test_a_long_prompt_is_cut_in_the_message(tmp_path):
    prompt = "Find x such that " + "x + " * 100 + "1 = 0."
    path = tmp_path / "values.json"
    path.write_text(json.dumps({prompt: "high"}))
    with pytest.raises(
        DataError, match=r"prompt 'Find x such that x \+ .{30,}\.\.\.': expected"
    ) as error:
        load_offline_values(path)
    assert prompt not in str(error.value)
