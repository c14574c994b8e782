"""Problems in: dataset loading and field mapping, prompts, synthetic tasks, subset splitting."""

from satseq.data.formats import RowFormat, detect_format, format_from_field_map
from satseq.data.loaders import load_problems
from satseq.data.prompts import (
    DEFAULT_PROMPT_FORMAT,
    SPO_ANSWER_INSTRUCTION,
    STEP_BY_STEP_INSTRUCTION,
    TOOL_INSTRUCTION,
    TOOL_PROMPT_FORMAT,
    PromptFormat,
    apply_chat_template,
    build_messages,
    build_prompt,
    prompt_ids,
)
from satseq.data.records import DataError, LoadedProblems, MathProblem
from satseq.data.split import split_problems, write_problems_parquet, write_subsets
from satseq.data.synthetic import (
    DIFFICULTY_LEVELS,
    NAMED_DIFFICULTIES,
    Difficulty,
    make_split,
    resolve_difficulty,
)

__all__ = [
    "DEFAULT_PROMPT_FORMAT",
    "DIFFICULTY_LEVELS",
    "NAMED_DIFFICULTIES",
    "SPO_ANSWER_INSTRUCTION",
    "STEP_BY_STEP_INSTRUCTION",
    "TOOL_INSTRUCTION",
    "TOOL_PROMPT_FORMAT",
    "DataError",
    "Difficulty",
    "LoadedProblems",
    "MathProblem",
    "PromptFormat",
    "RowFormat",
    "apply_chat_template",
    "build_messages",
    "build_prompt",
    "detect_format",
    "format_from_field_map",
    "load_problems",
    "make_split",
    "prompt_ids",
    "resolve_difficulty",
    "split_problems",
    "write_problems_parquet",
    "write_subsets",
]
