"""The synthetic task's text as the tiny model sees it: the tokenizer's corpus, and the prompts
and solutions of its warm start.

Variants, by what the warm start teaches:
- `carry` (the quickstart team, `builtin:tiny-carry-*`): `two_digit_sums` problems of the
  `warmup` split, solved by a `Teacher` (units column, then the sum), so RL on `train` and
  evaluation on `test` only ever meet problems the model was not warm-started on.
- `steps` and `tool` (`builtin:tiny`, `builtin:tiny-tool`, used by the tests and the tool
  quickstart): difficulty-1 problems of `train` and `warmup` (the level has only ~800
  expressions), so their runs train on `test` problems, which they have not memorised.

Each problem is asked with both answer instructions that configs use (the SPO wording of
`DEFAULT_PROMPT_FORMAT` and the step-by-step wording of `PromptConfig.instruction`), so the model
answers either prompt the same way. The tokenizer learns from the `steps` and `tool` text only,
so every builtin model shares one tokenizer (chain teams need that).
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
from satseq.models.teacher import Teacher

Variant = Literal["steps", "tool", "carry"]
VARIANTS: tuple[Variant, ...] = ("steps", "tool", "carry")
TOKENIZER_VARIANTS: tuple[Variant, ...] = ("steps", "tool")  # the formats make_split writes

QUICKSTART_DIFFICULTY = 1  # of the level-1 variants, steps and tool
QUICKSTART_STYLE = "symbols"
# Difficulty 1 has about 625 distinct train+warmup expressions; 600 leaves make_split some slack.
WARM_START_PROBLEMS = 600
CARRY_DIFFICULTY = "two_digit_sums"
# two_digit_sums has about 2,430 warmup expressions: the carry variant learns from nearly all.
CARRY_WARM_START_PROBLEMS = 2400
ANSWER_INSTRUCTIONS = (SPO_ANSWER_INSTRUCTION, STEP_BY_STEP_INSTRUCTION)


def warm_start_prompt_formats(variant: Variant) -> tuple[PromptFormat, ...]:
    """The prompt formats the warm start asks each problem in (one per answer instruction)."""
    tool_instruction = TOOL_INSTRUCTION if variant == "tool" else None
    return tuple(
        PromptFormat(answer_instruction=instruction, tool_instruction=tool_instruction)
        for instruction in ANSWER_INSTRUCTIONS
    )


def warm_start_problems(variant: Variant, teacher: Teacher | None = None) -> list[MathProblem]:
    """The warm start's problems, solved in `variant`'s format (`carry`: by `teacher`, a perfect
    one if None)."""
    if variant == "carry":
        return carry_problems(teacher or Teacher())
    return make_split(
        "train",
        WARM_START_PROBLEMS,
        seed=0,
        difficulty=QUICKSTART_DIFFICULTY,
        style=QUICKSTART_STYLE,
        solution_format=variant,
        with_warmup=True,
    )


def carry_problems(teacher: Teacher) -> list[MathProblem]:
    """`two_digit_sums` warmup problems with `teacher`'s solutions (a slip or a wrong fact makes
    the boxed answer wrong, and the model learns it so)."""
    problems = make_split(
        "warmup", CARRY_WARM_START_PROBLEMS, seed=0, difficulty=CARRY_DIFFICULTY, style="symbols"
    )
    return [teacher.solve(problem) for problem in problems]


def tokenizer_corpus() -> Iterator[str]:
    """Text to learn BPE merges from: every prompt wording and solution format of the synthetic
    task, in both problem styles, so common words and markup become single tokens."""
    for style in ("symbols", "words"):
        for variant in TOKENIZER_VARIANTS:
            problems = make_split(
                "train",
                WARM_START_PROBLEMS,
                seed=0,
                style=style,
                solution_format=variant,
                with_warmup=True,
            )
            for problem in problems:
                for prompt_format in warm_start_prompt_formats(variant):
                    for message in build_messages(problem, prompt_format):
                        yield message["content"]
                yield problem.solution or ""
