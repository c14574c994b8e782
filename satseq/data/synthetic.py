"""Synthetic integer arithmetic problems: the embedded default task (design §9).

A problem is a chain of 2+ non-negative integer operands joined by +, - and *, evaluated with the
usual precedence, optionally with one parenthesised group. It is written in symbols
("Compute 7 + 12 - 3.") or in words ("What is seven plus 12 minus three?").

Every problem carries a short worked solution for the supervised warm start of a tiny model,
in one of two formats:

- `steps`: each operation in evaluation order, then the boxed answer:
  `7+12=19, 19-3=16. \\boxed{16}`
- `tool`: one sandbox call, its output as the rollout loop returns it (design §5), then the answer:
  `<code>print(7+12-3)</code><interpreter>\\n16\\n</interpreter>\\n\\boxed{16}`

Splits are deterministic by seed and never share an expression: which split an expression
belongs to is fixed by a hash of its text, whatever the seed. Of every difficulty's expressions
about `TEST_PERCENT`% are `test` (held out: evaluation and validation), `WARMUP_PERCENT`% are
`warmup` (what the builtin tiny models are warm-started on) and the rest are `train` (what RL
trains on), so a run that trains on `train` and evaluates on `test` never meets a problem its
model was warm-started on, and never evaluates on one it trained on.

Difficulty is a level of DIFFICULTY_LEVELS (1-5: more operands, larger numbers, *, parentheses)
or a named task of NAMED_DIFFICULTIES, such as the quickstart's `two_digit_sums`.

`levels_1_to_3` is a Mixture for evaluations that must resolve small gains: level 1 has only
175 test expressions. Each of its problems draws level 1 (10%), 2 (60%) or 3 (30%), so over a
third are two-operand sums and differences (34-40% of 1,000 test problems), an easy share a 135M
model can learn from. Its test split holds 1,216-1,563 distinct problems before level 1's share
runs out, train 2,871-3,293 and warmup 1,979-2,264 (counted: seeds 0-19 for test, 0-4 for the
others). A problem's split is its expression's, whichever level drew it, so the mixture's splits
are as disjoint as the levels'.
"""

from __future__ import annotations

import hashlib
import math
import operator
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, TypeAlias

from satseq.data.records import DataError, MathProblem
from satseq.tool_tags import CODE_CLOSE, CODE_OPEN, INTERPRETER_CLOSE, INTERPRETER_OPEN

Style = Literal["words", "symbols", "mixed"]
SolutionFormat = Literal["steps", "tool"]

SPLITS = ("train", "test", "warmup")
TEST_PERCENT = 20
WARMUP_PERCENT = 30
OPERATIONS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
}
OPERATOR_WORDS = {"+": "plus", "-": "minus", "*": "times"}
SYMBOL_TEMPLATES = ("Compute {}.", "What is {}?", "Evaluate {}.", "Calculate {}.")
WORD_TEMPLATES = ("What is {}?", "Calculate {}.", "Work out {}.", "How much is {}?")
LARGEST_OPERAND = 999_999  # the largest number `number_to_words` spells


@dataclass(frozen=True)
class Difficulty:
    """The knobs of the generator: operands per problem, their range, operators, parentheses."""

    min_operands: int
    max_operands: int
    max_operand: int
    operators: tuple[str, ...] = ("+", "-")
    parentheses_probability: float = 0.0
    min_operand: int = 1

    def __post_init__(self) -> None:
        if not 2 <= self.min_operands <= self.max_operands:
            raise DataError(
                f"difficulty needs 2 <= min_operands <= max_operands, got {self.min_operands} "
                f"and {self.max_operands}"
            )
        if not 1 <= self.max_operand <= LARGEST_OPERAND:
            raise DataError(f"difficulty max_operand must be in 1..{LARGEST_OPERAND}")
        if not 0 <= self.min_operand <= self.max_operand:
            raise DataError("difficulty needs 0 <= min_operand <= max_operand")
        if not self.operators or not set(self.operators) <= set(OPERATIONS):
            raise DataError(
                f"difficulty operators must be a non-empty subset of {sorted(OPERATIONS)}, "
                f"got {self.operators}"
            )
        if not 0.0 <= self.parentheses_probability <= 1.0:
            raise DataError("difficulty parentheses_probability must be in [0, 1]")


# Level 1 is sized for the embedded tiny model (800 expressions: 625 train, 175 test);
# higher levels add operands, larger numbers, * and parentheses.
DIFFICULTY_LEVELS = {
    1: Difficulty(min_operands=2, max_operands=2, max_operand=20),
    2: Difficulty(min_operands=2, max_operands=3, max_operand=50),
    3: Difficulty(min_operands=3, max_operands=3, max_operand=20, operators=("+", "-", "*")),
    4: Difficulty(
        min_operands=3,
        max_operands=4,
        max_operand=50,
        operators=("+", "-", "*"),
        parentheses_probability=0.3,
    ),
    5: Difficulty(
        min_operands=4,
        max_operands=5,
        max_operand=100,
        operators=("+", "-", "*"),
        parentheses_probability=0.5,
    ),
}


@dataclass(frozen=True)
class Mixture:
    """A task of several levels: each problem draws its level of DIFFICULTY_LEVELS by weight.

    `shares` pairs each level with a positive weight (a level's share is its weight over their
    sum); a problem records its level in `meta["level"]`.
    """

    shares: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        if not self.shares:
            raise DataError("a mixture needs at least one (level, weight) pair")
        levels = [level for level, _ in self.shares]
        if len(set(levels)) < len(levels):
            raise DataError(f"a mixture names each level once, got levels {levels}")
        for level, weight in self.shares:
            if level not in DIFFICULTY_LEVELS:
                raise DataError(
                    f"mixture level {level!r} is not one of {sorted(DIFFICULTY_LEVELS)}"
                )
            if not (weight > 0 and math.isfinite(weight)):
                raise DataError(
                    f"mixture weight of level {level} must be a positive number, got {weight!r}"
                )

    def draw_level(self, rng: random.Random) -> int:
        """A level, each with its weight's share of the chance."""
        levels, weights = zip(*self.shares, strict=True)
        return rng.choices(levels, weights)[0]


# Tasks with a name rather than a level. `two_digit_sums` is the quickstart's (configs/
# quickstart.yaml): a + b with two-digit a and b, 8,100 expressions (about 1,600 test, 2,400
# warmup, 4,000 train), where the skill to learn is the carry, needed by 45% of them.
# `levels_1_to_3` is the held-out set that resolves small gains (module docstring).
NAMED_DIFFICULTIES: dict[str, Difficulty | Mixture] = {
    "two_digit_sums": Difficulty(
        min_operands=2, max_operands=2, min_operand=10, max_operand=99, operators=("+",)
    ),
    "levels_1_to_3": Mixture(((1, 0.1), (2, 0.6), (3, 0.3))),
}


@dataclass(frozen=True)
class BinaryOp:
    """One operation of an expression tree."""

    operator: str
    left: Expression
    right: Expression


Expression: TypeAlias = int | BinaryOp


@dataclass(frozen=True)
class ArithmeticExpression:
    """Operands and operators as written, and which operands (if any) sit in parentheses."""

    operands: tuple[int, ...]
    operators: tuple[str, ...]
    group: tuple[int, int] | None = None  # indices of the first and last operand in parentheses

    def render(
        self,
        number_text: Callable[[int], str] = str,
        operator_text: Callable[[str], str] = str,
        separator: str = "",
    ) -> str:
        """The expression as text; the defaults give the compact, Python-evaluable form."""
        parts = []
        for index, operand in enumerate(self.operands):
            if index > 0:
                parts.append(operator_text(self.operators[index - 1]))
            text = number_text(operand)
            if self.group is not None and index == self.group[0]:
                text = "(" + text
            if self.group is not None and index == self.group[1]:
                text += ")"
            parts.append(text)
        return separator.join(parts)

    def tree(self) -> Expression:
        """The evaluation tree: the parenthesised group first, then * before + and -."""
        if self.group is None:
            return _precedence_tree(self.operands, self.operators)
        first, last = self.group
        inner = _precedence_tree(self.operands[first : last + 1], self.operators[first:last])
        operands = (*self.operands[:first], inner, *self.operands[last + 1 :])
        return _precedence_tree(operands, self.operators[:first] + self.operators[last:])


def make_split(
    split: str,
    n: int,
    seed: int = 0,
    difficulty: int | str | Difficulty | Mixture = 1,
    style: Style = "mixed",
    solution_format: SolutionFormat = "steps",
    *,
    with_warmup: bool = False,
) -> list[MathProblem]:
    """`n` distinct problems of `split` ("train", "test" or "warmup"), the same for the same
    arguments.

    `difficulty` is a level of DIFFICULTY_LEVELS (1-5), a name of NAMED_DIFFICULTIES, a
    Difficulty or a Mixture; `style` is "words", "symbols" or "mixed" (each problem picks one).
    The problem text does not depend on `solution_format`, so the steps and tool variants of a
    split hold the same problems. `with_warmup` (split "train" only) also draws from the warmup
    split's expressions, as "train" did before that split existed: the level-1 builtin models
    (`builtin:tiny`, `builtin:tiny-tool`) are warm-started on those problems.
    """
    if split not in SPLITS:
        raise DataError(f"unknown synthetic split {split!r}; use one of {SPLITS}")
    if n < 0:
        raise DataError(f"number of problems must be >= 0, got {n}")
    if style not in ("words", "symbols", "mixed"):
        raise DataError(f"unknown style {style!r}; use 'words', 'symbols' or 'mixed'")
    if solution_format not in ("steps", "tool"):
        raise DataError(f"unknown solution format {solution_format!r}; use 'steps' or 'tool'")
    knobs = resolve_difficulty(difficulty)
    accepted = {split, "warmup"} if with_warmup and split == "train" else {split}
    # A string seed is hashed by `random` itself (sha512), so it is stable across runs/platforms.
    rng = random.Random(f"satseq.synthetic/{split}/{seed}")
    problems: list[MathProblem] = []
    seen: set[str] = set()
    # Enough draws, shared by all problems, unless the difficulty has too few expressions.
    draws = iter(range(50 * n + 1000))
    while len(problems) < n:
        # A mixture's problem keeps the level it drew until it finds an expression of it.
        level = knobs.draw_level(rng) if isinstance(knobs, Mixture) else None
        level_knobs = knobs if level is None else DIFFICULTY_LEVELS[level]
        drawn = _draw_unseen(rng, level_knobs, draws, seen, accepted)
        if drawn is None:
            raise _too_few_problems(len(problems), n, split, difficulty, level)
        problem_style = rng.choice(("words", "symbols")) if style == "mixed" else style
        problem_id = f"arith-{split}-{seed}-{len(problems)}"
        problems.append(_problem(problem_id, *drawn, problem_style, solution_format, rng, level))
    return problems


def split_of(compact_expression: str) -> str:
    """The split an expression belongs to, from a hash of its compact text (seed-independent)."""
    digest = hashlib.sha256(compact_expression.encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") % 100
    if bucket < TEST_PERCENT:
        return "test"
    return "warmup" if bucket < TEST_PERCENT + WARMUP_PERCENT else "train"


def evaluate(expression: Expression, steps: list[str] | None = None) -> int:
    """The value of an expression tree; appends each operation to `steps` as `a+b=c`."""
    if isinstance(expression, int):
        return expression
    left = evaluate(expression.left, steps)
    right = evaluate(expression.right, steps)
    value = OPERATIONS[expression.operator](left, right)
    if steps is not None:
        steps.append(f"{_step_operand(left)}{expression.operator}{_step_operand(right)}={value}")
    return value


def number_to_words(number: int) -> str:
    """English words for 0..999,999: 'seven', 'forty-two', 'three hundred five'."""
    if not 0 <= number <= LARGEST_OPERAND:
        raise ValueError(f"number_to_words takes 0..{LARGEST_OPERAND}, got {number}")
    if number == 0:
        return "zero"
    thousands, rest = divmod(number, 1000)
    words = [f"{_words_below_1000(thousands)} thousand"] if thousands else []
    if rest:
        words.append(_words_below_1000(rest))
    return " ".join(words)


_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
)  # fmt: skip
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def _words_below_1000(number: int) -> str:
    hundreds, rest = divmod(number, 100)
    words = [f"{_ONES[hundreds]} hundred"] if hundreds else []
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        words.append(_TENS[tens] + (f"-{_ONES[ones]}" if ones else ""))
    elif rest:
        words.append(_ONES[rest])
    return " ".join(words)


def resolve_difficulty(difficulty: int | str | Difficulty | Mixture) -> Difficulty | Mixture:
    """The generator's knobs for a level, a task name, a Difficulty or a Mixture; DataError if
    unknown."""
    if isinstance(difficulty, Difficulty | Mixture):
        return difficulty
    if isinstance(difficulty, str) and difficulty in NAMED_DIFFICULTIES:
        return NAMED_DIFFICULTIES[difficulty]
    if isinstance(difficulty, int) and difficulty in DIFFICULTY_LEVELS:
        return DIFFICULTY_LEVELS[difficulty]
    raise DataError(
        f"unknown difficulty level {difficulty!r}; use one of {sorted(DIFFICULTY_LEVELS)}, "
        f"a task name of {sorted(NAMED_DIFFICULTIES)}, a Difficulty(...) or a Mixture(...)"
    )


def _draw_unseen(
    rng: random.Random,
    knobs: Difficulty,
    draws: Iterator[int],
    seen: set[str],
    accepted: set[str],
) -> tuple[ArithmeticExpression, str] | None:
    """The next drawn expression of an `accepted` split not `seen` yet (and now seen), with its
    compact text; None once `draws` runs out."""
    for _ in draws:
        expression = _draw_expression(rng, knobs)
        compact = expression.render()
        if compact not in seen and split_of(compact) in accepted:
            seen.add(compact)
            return expression, compact
    return None


def _problem(
    problem_id: str,
    expression: ArithmeticExpression,
    compact: str,
    style: str,
    solution_format: SolutionFormat,
    rng: random.Random,
    level: int | None,
) -> MathProblem:
    meta = {
        "expression": compact,
        "style": style,
        "num_operands": len(expression.operands),
    }
    if level is not None:  # a mixture's problem
        meta["level"] = level
    return MathProblem(
        problem_id=problem_id,
        problem=_problem_text(expression, style, rng),
        answer=str(evaluate(expression.tree())),
        solution=_solution(expression, solution_format),
        meta=meta,
    )


def _too_few_problems(
    found: int, n: int, split: str, difficulty: object, level: int | None
) -> DataError:
    advice = "ask for fewer, or raise the difficulty (more or larger operands)"
    if level is not None:
        advice = f"level {level} ran out of {split!r} problems: ask for fewer, or weight it less"
    return DataError(
        f"found only {found} distinct {split!r} problems at difficulty {difficulty}, {n} were "
        f"asked for; {advice}"
    )


def _draw_expression(rng: random.Random, knobs: Difficulty) -> ArithmeticExpression:
    num_operands = rng.randint(knobs.min_operands, knobs.max_operands)
    operands = tuple(rng.randint(knobs.min_operand, knobs.max_operand) for _ in range(num_operands))
    operators = tuple(rng.choice(knobs.operators) for _ in range(num_operands - 1))
    group = None
    # A group must leave an operand outside it (around all of them it changes nothing): 3+ needed.
    if num_operands >= 3 and rng.random() < knobs.parentheses_probability:
        first = rng.randint(0, num_operands - 2)
        last = rng.randint(first + 1, num_operands - 1 if first > 0 else num_operands - 2)
        group = (first, last)
    return ArithmeticExpression(operands, operators, group)


def _precedence_tree(operands: tuple[Expression, ...], operators: tuple[str, ...]) -> Expression:
    """Left-associative tree of a flat chain, with * binding tighter than + and -."""
    terms = [operands[0]]
    term_operators = []
    for operator_symbol, operand in zip(operators, operands[1:], strict=True):
        if operator_symbol == "*":
            terms[-1] = BinaryOp("*", terms[-1], operand)
        else:
            term_operators.append(operator_symbol)
            terms.append(operand)
    tree = terms[0]
    for operator_symbol, term in zip(term_operators, terms[1:], strict=True):
        tree = BinaryOp(operator_symbol, tree, term)
    return tree


def _problem_text(expression: ArithmeticExpression, style: str, rng: random.Random) -> str:
    if style == "symbols":
        return rng.choice(SYMBOL_TEMPLATES).format(expression.render(separator=" "))

    # Words style spells about half the numbers out, as people do ("seven plus 12").
    def number_text(number: int) -> str:
        return number_to_words(number) if rng.random() < 0.5 else str(number)

    text = expression.render(number_text, OPERATOR_WORDS.__getitem__, separator=" ")
    return rng.choice(WORD_TEMPLATES).format(text)


def _solution(expression: ArithmeticExpression, solution_format: SolutionFormat) -> str:
    steps: list[str] = []
    answer = evaluate(expression.tree(), steps)
    if solution_format == "tool":
        return (
            f"{CODE_OPEN}print({expression.render()}){CODE_CLOSE}"
            f"{INTERPRETER_OPEN}\n{answer}\n{INTERPRETER_CLOSE}\n\\boxed{{{answer}}}"
        )
    return f"{', '.join(steps)}. \\boxed{{{answer}}}"


def _step_operand(value: int) -> str:
    # "3-8=-5, 2-(-5)=7" rather than the unreadable "2--5=7".
    return f"({value})" if value < 0 else str(value)
