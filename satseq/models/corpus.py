"""The synthetic task's text as the tiny model sees it: the tokenizer's corpus, and the prompts
and solutions of its warm start.

The warm start uses the quickstart task (DESIGN §9: difficulty 1, symbols) from the `train`
split only, so pass rates measured on `make_split("test", ...)` are on held-out expressions.
Each problem is asked with both answer instructions that configs use (the SPO wording of
`DEFAULT_PROMPT_FORMAT` and the step-by-step wording of `PromptConfig.instruction`), so the model
answers either prompt the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from satseq.data import (
    SPO_ANSWER_INSTRUCTION,
    STEP_BY_STEP_INSTRUCTION,
    TOOL_INSTRUCTION,
    MathProblem,
    PromptFormat,
    build_messages,
    make_split,
)

Variant = Literal["steps", "tool"]
VARIANTS: tuple[Variant, ...] = ("steps", "tool")

QUICKSTART_DIFFICULTY = 1
QUICKSTART_STYLE = "symbols"
# Difficulty 1 has about 625 distinct train expressions; 600 leaves make_split some slack.
WARM_START_PROBLEMS = 600
ANSWER_INSTRUCTIONS = (SPO_ANSWER_INSTRUCTION, STEP_BY_STEP_INSTRUCTION)


def warm_start_prompt_formats(variant: Variant) -> tuple[PromptFormat, ...]:
    """The prompt formats the warm start asks each problem in (one per answer instruction)."""
    tool_instruction = TOOL_INSTRUCTION if variant == "tool" else None
    return tuple(
        PromptFormat(answer_instruction=instruction, tool_instruction=tool_instruction)
        for instruction in ANSWER_INSTRUCTIONS
    )


def warm_start_problems(variant: Variant) -> list[MathProblem]:
    """The warm start's problems: quickstart-task train problems, solved in `variant`'s format."""
    return make_split(
        "train",
        WARM_START_PROBLEMS,
        seed=0,
        difficulty=QUICKSTART_DIFFICULTY,
        style=QUICKSTART_STYLE,
        solution_format=variant,
    )


def tokenizer_corpus() -> Iterator[str]:
    """Text to learn BPE merges from: every prompt wording and solution format of the synthetic
    task, in both problem styles, so common words and markup become single tokens."""
    for style in ("symbols", "words"):
        for variant in VARIANTS:
            problems = make_split(
                "train", WARM_START_PROBLEMS, seed=0, style=style, solution_format=variant
            )
            for problem in problems:
                for prompt_format in warm_start_prompt_formats(variant):
                    for message in build_messages(problem, prompt_format):
                        yield message["content"]
                yield problem.solution or ""
