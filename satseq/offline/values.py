"""The offline-values file: JSON `{prompt: [scores]}`, the prior of SPO's value tracker (§4).

Keys are the raw problem texts (`MathProblem.problem`), values the base model's scores on that
problem. The scores stay floats here: the tracker binarises them when it builds its prior.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from satseq.data import DataError
from satseq.files import write_text_atomically


def load_offline_values(path: str | Path) -> dict[str, list[float]]:
    """`{prompt: [scores]}` from a file written by `satseq offline-values merge`.

    Raises DataError naming the file and the offending key or value: a file that is missing or
    not JSON, a top level that is not an object, a key given twice, an empty key, or a value
    that is not a non-empty list of finite numbers.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(
            f"{path}: offline values file not found; write it with `satseq offline-values merge`"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: cannot read the offline values file ({error})") from None
    try:
        data = json.loads(text, object_pairs_hook=_refuse_repeated_keys)
    except json.JSONDecodeError as error:
        raise DataError(
            f"{path}:{error.lineno}: not valid JSON ({error.msg}, column {error.colno})"
        ) from None
    except _RepeatedKey as repeated:
        raise DataError(
            f"{path}: prompt {preview(repeated.key)} is a key twice; a prompt must have one list "
            "of scores (merge the files with `satseq offline-values merge`)"
        ) from None
    if not isinstance(data, dict):
        raise DataError(
            f"{path}: expected a JSON object {{prompt: [scores]}}, got {type(data).__name__}"
        )
    return {prompt: _checked_scores(path, prompt, scores) for prompt, scores in data.items()}


def write_offline_values(values: dict[str, list[float]], path: str | Path) -> Path:
    """Write `{prompt: [scores]}` atomically (a trainer never reads half a file)."""
    return write_text_atomically(path, json.dumps(values, ensure_ascii=False, indent=1) + "\n")


def is_score(value: Any) -> bool:
    """A finite number; JSON true/false are not scores (bool is an int in Python)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def preview(text: str, limit: int = 60) -> str:
    """`text` quoted and cut to `limit` characters, for error messages about long prompts."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _checked_scores(path: Path, prompt: str, scores: Any) -> list[float]:
    if not prompt.strip():
        raise DataError(f"{path}: an empty prompt is a key; keys are the raw problem texts")
    where = f"{path}: prompt {preview(prompt)}"
    if not isinstance(scores, list):
        raise DataError(f"{where}: expected a list of scores, got {json.dumps(scores)[:60]}")
    if not scores:
        raise DataError(
            f"{where}: has an empty list of scores; remove the key (a prompt without offline "
            "scores gets the 0.5/0.5 prior)"
        )
    for index, score in enumerate(scores):
        if not is_score(score):
            raise DataError(
                f"{where}: score {index} is {json.dumps(score)[:60]}, not a finite number"
            )
    return [float(score) for score in scores]


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object hook: plain `json.loads` keeps the last of repeated keys without a word."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _RepeatedKey(key)
        result[key] = value
    return result
