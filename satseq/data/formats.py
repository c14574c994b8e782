"""Row formats: which fields of a dataset row hold the problem, the answer and the rest.

Four formats are recognised from a row's field names (design §8), tried in this order:

- verl's RL parquet rows, DAPO-Math-17k's among them: `prompt` (a chat list of `{role, content}`
  messages, whose last user message is the problem; or plain text as in
  open-r1/DAPO-Math-17k-Processed), `reward_model.ground_truth` the answer, `extra_info.index`
  the id when present; the other top-level columns (`data_source`, `ability`) go to `meta`;
- the seeds' preference format `{prompt, chosen, rejected}`: `chosen` is the reference; the answer
  is its last `\\boxed{}` content if it has one, otherwise the whole of `chosen`, stripped;
- MATH-500: `problem`, `answer`, `solution`, `subject`, `level`, `unique_id`;
- `{problem, answer}`, optionally with `problem_id`, `solution` and `meta` (this is also the
  layout `satseq.data.split` writes).

Any other layout needs an explicit field map such as
`{"problem": "question", "answer": "reward_model.ground_truth"}` (dotted paths reach into
nested fields). Top-level fields a format does not use are kept in `MathProblem.meta`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from satseq.data.records import DataError, MathProblem

# The instruction wrapper DAPO-Math-17k puts around each problem. It asks for "Answer: ..." lines,
# which contradicts our \boxed{} instruction, and it is not part of the problem text the SPO
# tracker keys on, so it is removed when present at both ends.
DAPO_INSTRUCTION_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_INSTRUCTION_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'

FIELD_MAP_KEYS = ("problem", "answer", "solution", "problem_id")


class BadRow(Exception):
    """Why a row cannot become a MathProblem; the loader adds where it is, then skips or raises."""


@dataclass(frozen=True)
class RowFormat:
    """Where one format keeps each field, as dotted paths into a row.

    `problem` and `answer` are required in every row; `solution` and `problem_id` are read when
    present. With `answer_in_boxed`, the answer field holds a reference response, and the answer
    is its last `\\boxed{}` content (the response then doubles as the solution).
    """

    name: str
    problem: str
    answer: str
    solution: str | None = None
    problem_id: str | None = None
    answer_in_boxed: bool = False

    def used_top_level_fields(self) -> set[str]:
        paths = (self.problem, self.answer, self.solution, self.problem_id)
        return {path.split(".")[0] for path in paths if path is not None}

    def to_problem(self, row: Mapping[str, Any], default_id: str) -> MathProblem:
        """Convert one row; raises BadRow with the reason when a field is missing or wrong."""
        problem = _problem_text(_required(row, self.problem), self.problem)
        reference = _answer_text(_required(row, self.answer), self.answer)
        solution = _optional_text(row, self.solution)
        if self.answer_in_boxed:
            boxed = last_boxed_content(reference)
            answer = reference if boxed is None else boxed.strip()
            if boxed is not None and solution is None:
                solution = reference
            if not answer:
                raise BadRow(f"field {self.answer!r} has an empty \\boxed{{}} answer")
        else:
            answer = reference
        problem_id = _optional_text(row, self.problem_id) or default_id
        return MathProblem(
            problem_id=problem_id,
            problem=problem,
            answer=answer,
            solution=solution,
            meta=_meta(row, self.used_top_level_fields()),
        )


VERL_RL = RowFormat(
    name="verl (DAPO-Math-17k)",
    problem="prompt",
    answer="reward_model.ground_truth",
    problem_id="extra_info.index",
)
SEED_PREFERENCE = RowFormat(
    name="{prompt, chosen, rejected}", problem="prompt", answer="chosen", answer_in_boxed=True
)
MATH_500 = RowFormat(
    name="MATH-500", problem="problem", answer="answer", solution="solution", problem_id="unique_id"
)
PROBLEM_ANSWER = RowFormat(
    name="{problem, answer}",
    problem="problem",
    answer="answer",
    solution="solution",
    problem_id="problem_id",
)


def detect_format(field_names: Collection[str]) -> RowFormat:
    """The format whose fields `field_names` has; raises DataError naming the known formats."""
    names = set(field_names)
    if {"prompt", "reward_model"} <= names:
        return VERL_RL
    if {"prompt", "chosen"} <= names:
        return SEED_PREFERENCE
    if {"problem", "answer", "unique_id"} <= names:
        return MATH_500
    if {"problem", "answer"} <= names:
        return PROBLEM_ANSWER
    raise DataError(
        f"cannot tell the dataset format from its fields {sorted(names)}; known formats: "
        "verl/DAPO-Math-17k {prompt, reward_model.ground_truth}, {prompt, chosen, rejected}, "
        "MATH-500 {problem, answer, unique_id}, {problem, answer}. Give a field map, e.g. "
        '{"problem": "question", "answer": "reward_model.ground_truth"}'
    )


def format_from_field_map(field_map: Mapping[str, str]) -> RowFormat:
    """A RowFormat from a user's field map; `problem` and `answer` default to those field names."""
    unknown = sorted(set(field_map) - set(FIELD_MAP_KEYS))
    if unknown:
        raise DataError(
            f"unknown field map key(s) {unknown}: the keys are {list(FIELD_MAP_KEYS)}, each "
            "mapped to a (dotted) field path of the dataset"
        )
    paths = {key: field_map.get(key) for key in FIELD_MAP_KEYS}
    paths["problem"] = paths["problem"] or "problem"
    paths["answer"] = paths["answer"] or "answer"
    shown = ", ".join(f"{key}: {path}" for key, path in paths.items() if path is not None)
    return RowFormat(name=f"field map {{{shown}}}", **paths)


def last_boxed_content(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    content_start = start + len("\\boxed{")
    for position in range(content_start, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            if depth == 0:
                return text[content_start:position]
            depth -= 1
    return None  # unbalanced braces: no complete \boxed{}


def _lookup(row: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path, or None when any step is missing (or null, as in parquet)."""
    value: Any = row
    for key in path.split("."):
        if not isinstance(value, Mapping) or value.get(key) is None:
            return None
        value = value[key]
    return value


def _required(row: Mapping[str, Any], path: str) -> Any:
    value = _lookup(row, path)
    if value is None:
        raise BadRow(f"missing field {path!r}")
    return value


def _problem_text(value: Any, path: str) -> str:
    """Problem text from a string, or from the last user message of a chat list."""
    if isinstance(value, list):
        value = _last_user_message(value, path)
    if not isinstance(value, str):
        raise BadRow(
            f"field {path!r} must be text or a list of chat messages, got {type(value).__name__}"
        )
    if value.startswith(DAPO_INSTRUCTION_PREFIX) and value.endswith(DAPO_INSTRUCTION_SUFFIX):
        value = value[len(DAPO_INSTRUCTION_PREFIX) : -len(DAPO_INSTRUCTION_SUFFIX)]
    text = value.strip()
    if not text:
        raise BadRow(f"field {path!r} is an empty problem")
    return text


def _last_user_message(messages: list[Any], path: str) -> Any:
    user_contents = [
        message.get("content")
        for message in messages
        if isinstance(message, Mapping) and message.get("role") == "user"
    ]
    if not user_contents:
        raise BadRow(f"field {path!r} is a chat list with no {{role: user, content}} message")
    return user_contents[-1]


def _answer_text(value: Any, path: str) -> str:
    # Numeric answers are common in JSON (`"answer": 42`); bool is excluded because True is not
    # a math answer even though Python treats it as an int.
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise BadRow(f"field {path!r} must be text or a number, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise BadRow(f"field {path!r} is an empty answer")
    return text


def _optional_text(row: Mapping[str, Any], path: str | None) -> str | None:
    value = None if path is None else _lookup(row, path)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise BadRow(f"field {path!r} must be text, got {type(value).__name__}")
    return str(value)


def _meta(row: Mapping[str, Any], used_fields: set[str]) -> dict[str, Any]:
    """The row's other top-level fields; a `meta` field (object or JSON text) is merged in."""
    meta = {key: value for key, value in row.items() if key not in used_fields and key != "meta"}
    stored = row.get("meta")
    if isinstance(stored, str):
        # Plain text rather than the JSON `split` writes is kept as it is, below.
        with contextlib.suppress(json.JSONDecodeError):
            stored = json.loads(stored)
    if isinstance(stored, Mapping):
        meta.update(stored)
    elif stored is not None:
        meta["meta"] = stored
    return meta
