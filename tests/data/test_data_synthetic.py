"""The synthetic arithmetic generator: deterministic, disjoint splits, correct answers."""

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from satseq.data import DIFFICULTY_LEVELS, NAMED_DIFFICULTIES, DataError, Difficulty, make_split
from satseq.data.synthetic import (
    SPLITS,
    ArithmeticExpression,
    Mixture,
    number_to_words,
    split_of,
)

# The test's own reading of the problem text, independent of the generator's code.
TEMPLATE = re.compile(r"(?:Compute|What is|Evaluate|Calculate|Work out|How much is) (.+)[.?]")
OPERATOR_SYMBOLS = {"plus": "+", "minus": "-", "times": "*"}
NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
    "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
    "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
}  # fmt: skip


def words_to_int(text: str) -> int:
    total, current = 0, 0
    for word in text.replace("-", " ").split():
        if word == "hundred":
            current *= 100
        elif word == "thousand":
            total, current = total + current * 1000, 0
        else:
            current += NUMBER_WORDS[word]
    return total + current


def python_expression(problem_text: str) -> str:
    """The problem as a Python expression: symbols as they are, words translated back."""
    body = TEMPLATE.fullmatch(problem_text).group(1)
    pieces = re.split(r" (plus|minus|times) ", body)
    if len(pieces) == 1:
        return body.replace(" ", "")
    parts = []
    for index, piece in enumerate(pieces):
        if index % 2:
            parts.append(OPERATOR_SYMBOLS[piece])
            continue
        number = piece.strip("()")
        value = number if number.isdigit() else str(words_to_int(number))
        parts.append("(" * piece.startswith("(") + value + ")" * piece.endswith(")"))
    return "".join(parts)


def safe_eval(expression: str) -> int:
    assert re.fullmatch(r"[0-9+*()-]+", expression), expression
    return eval(expression, {"__builtins__": {}})


def test_same_arguments_give_the_same_problems_and_another_seed_others():
    first = make_split("train", 50, seed=3, difficulty=4)
    assert first == make_split("train", 50, seed=3, difficulty=4)
    assert [p.problem for p in first] != [p.problem for p in make_split("train", 50, seed=4)]


@pytest.mark.parametrize("difficulty", [1, 3, 5, "two_digit_sums", "levels_1_to_3"])
def test_train_test_and_warmup_share_no_expression_even_across_seeds(difficulty):
    splits = {
        "train": make_split("train", 300, seed=0, difficulty=difficulty),
        "test": make_split("test", 60, seed=1, difficulty=difficulty),
        "warmup": make_split("warmup", 200, seed=2, difficulty=difficulty),
    }
    expressions = {name: {p.meta["expression"] for p in ps} for name, ps in splits.items()}
    assert len(expressions["train"]) == 300  # distinct within a split too
    for name, ps in splits.items():
        assert {split_of(p.meta["expression"]) for p in ps} == {name}
    assert expressions["train"].isdisjoint(expressions["test"])
    assert expressions["train"].isdisjoint(expressions["warmup"])
    assert expressions["test"].isdisjoint(expressions["warmup"])


def test_splits_take_their_share_of_every_expression():
    digits = range(10, 100)
    every_sum = [ArithmeticExpression((a, b), ("+",)).render() for a in digits for b in digits]
    counts = {split: sum(split_of(e) == split for e in every_sum) for split in SPLITS}
    assert sum(counts.values()) == 8100
    assert counts["test"] == pytest.approx(0.2 * 8100, rel=0.05)
    assert counts["warmup"] == pytest.approx(0.3 * 8100, rel=0.05)


def test_train_with_warmup_draws_from_both_as_train_did_before_warmup_existed():
    both = make_split("train", 600, seed=0, difficulty=1, with_warmup=True)
    assert {split_of(p.meta["expression"]) for p in both} == {"train", "warmup"}
    train_only = make_split("train", 300, seed=0, difficulty=1)
    assert {split_of(p.meta["expression"]) for p in train_only} == {"train"}


def test_two_digit_sums_are_sums_of_two_two_digit_numbers():
    assert NAMED_DIFFICULTIES["two_digit_sums"].min_operand == 10
    for problem in make_split("train", 200, seed=0, difficulty="two_digit_sums"):
        a, b = problem.meta["expression"].split("+")
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert problem.answer == str(int(a) + int(b))


@pytest.mark.parametrize("difficulty", [*sorted(DIFFICULTY_LEVELS), *sorted(NAMED_DIFFICULTIES)])
def test_answers_match_an_independent_evaluation_of_the_problem_text(difficulty):
    for problem in make_split("train", 100, seed=7, difficulty=difficulty, style="mixed"):
        expression = python_expression(problem.problem)
        assert problem.answer == str(safe_eval(expression)), problem
        assert expression == problem.meta["expression"]


def test_step_solutions_are_correct_arithmetic_ending_in_the_boxed_answer():
    for problem in make_split("test", 100, seed=2, difficulty=5):
        steps, boxed = re.fullmatch(r"(.+)\. \\boxed\{(-?\d+)\}", problem.solution).groups()
        assert boxed == problem.answer
        for step in steps.split(", "):
            left, result = step.rsplit("=", 1)
            assert safe_eval(left) == int(result), step
        assert result == problem.answer  # the last step gives the answer


def test_tool_solutions_print_the_expression_and_read_the_answer_back():
    steps = make_split("train", 40, seed=5, difficulty=4, solution_format="steps")
    tools = make_split("train", 40, seed=5, difficulty=4, solution_format="tool")
    assert [p.problem for p in steps] == [p.problem for p in tools]
    for problem in tools:
        match = re.fullmatch(
            r"<code>print\((.+)\)</code><interpreter>\n(-?\d+)\n</interpreter>\n\\boxed\{(-?\d+)\}",
            problem.solution,
        )
        code, printed, boxed = match.groups()
        assert str(safe_eval(code)) == printed == boxed == problem.answer


def test_example_solutions_read_as_documented():
    difficulty = Difficulty(min_operands=3, max_operands=3, max_operand=20)
    problem = make_split("train", 1, seed=0, difficulty=difficulty, style="symbols")[0]
    a, op1, b, op2, c = re.fullmatch(
        r"(\d+)([+-])(\d+)([+-])(\d+)", problem.meta["expression"]
    ).groups()
    first = safe_eval(f"{a}{op1}{b}")
    shown = f"({first})" if first < 0 else str(first)
    expected = f"{a}{op1}{b}={first}, {shown}{op2}{c}={problem.answer}. \\boxed{{{problem.answer}}}"
    assert problem.solution == expected


def test_style_selects_words_symbols_or_a_mix():
    words = make_split("train", 30, seed=0, difficulty=2, style="words")
    symbols = make_split("train", 30, seed=0, difficulty=2, style="symbols")
    mixed = make_split("train", 60, seed=0, difficulty=2, style="mixed")
    assert all(re.search(r"\b(plus|minus)\b", p.problem) for p in words)
    assert all(re.search(r"\d [+-] \d", p.problem) for p in symbols)
    assert {p.meta["style"] for p in mixed} == {"words", "symbols"}


def test_difficulty_bounds_operands_and_operators():
    easy = make_split("train", 200, seed=0, difficulty=1)
    hard = make_split("train", 200, seed=0, difficulty=5)
    assert {p.meta["num_operands"] for p in easy} == {2}
    assert all(0 < int(n) <= 20 for p in easy for n in re.findall(r"\d+", p.meta["expression"]))
    assert not any("*" in p.meta["expression"] or "(" in p.meta["expression"] for p in easy)
    assert {p.meta["num_operands"] for p in hard} == {4, 5}
    assert any("(" in p.meta["expression"] for p in hard)


def assert_within_knobs(compact_expression: str, knobs: Difficulty) -> None:
    operands = [int(number) for number in re.findall(r"\d+", compact_expression)]
    operators = re.findall(r"[+*-]", compact_expression)
    assert knobs.min_operands <= len(operands) <= knobs.max_operands, compact_expression
    assert all(knobs.min_operand <= operand <= knobs.max_operand for operand in operands)
    assert set(operators) <= set(knobs.operators), compact_expression
    assert "(" not in compact_expression or knobs.parentheses_probability > 0


def test_levels_1_to_3_holds_a_thousand_test_problems_none_of_train_or_warmup():
    test = make_split("test", 1000, seed=0, difficulty="levels_1_to_3")
    expressions = {p.meta["expression"] for p in test}
    assert len(expressions) == 1000
    assert {split_of(expression) for expression in expressions} == {"test"}
    for split, seed in [("train", 0), ("train", 1), ("warmup", 0)]:
        others = make_split(split, 1000, seed=seed, difficulty="levels_1_to_3")
        assert expressions.isdisjoint(p.meta["expression"] for p in others)


def test_levels_1_to_3_is_the_same_for_a_seed_and_a_longer_split_extends_it():
    first = make_split("test", 300, seed=5, difficulty="levels_1_to_3")
    assert first == make_split("test", 300, seed=5, difficulty="levels_1_to_3")
    assert first == make_split("test", 400, seed=5, difficulty="levels_1_to_3")[:300]
    other_seed = make_split("test", 300, seed=6, difficulty="levels_1_to_3")
    assert [p.problem for p in first] != [p.problem for p in other_seed]


def test_levels_1_to_3_problems_keep_their_levels_knobs_and_shares():
    mixture = NAMED_DIFFICULTIES["levels_1_to_3"]
    problems = make_split("test", 1000, seed=0, difficulty="levels_1_to_3")
    for problem in problems:
        assert_within_knobs(problem.meta["expression"], DIFFICULTY_LEVELS[problem.meta["level"]])
    # A problem keeps the level it drew until it finds an expression of it, so a level's count is
    # Binomial(n, share): 4 standard errors leave a seed a ~1e-4 chance of failing.
    total = sum(weight for _, weight in mixture.shares)
    for level, weight in mixture.shares:
        share = weight / total
        drawn = sum(p.meta["level"] == level for p in problems) / len(problems)
        assert abs(drawn - share) <= 4 * math.sqrt(share * (1 - share) / len(problems)), level


@settings(max_examples=30, deadline=None)
@given(
    weights=st.dictionaries(
        st.sampled_from(sorted(DIFFICULTY_LEVELS)), st.floats(0.01, 100), min_size=1
    ),
    seed=st.integers(0, 10**6),
    split=st.sampled_from(SPLITS),
)
def test_any_mixture_draws_distinct_problems_of_its_split_and_levels(weights, seed, split):
    problems = make_split(split, 20, seed=seed, difficulty=Mixture(tuple(weights.items())))
    assert len({p.meta["expression"] for p in problems}) == 20
    for problem in problems:
        assert problem.meta["level"] in weights
        assert_within_knobs(problem.meta["expression"], DIFFICULTY_LEVELS[problem.meta["level"]])
        assert split_of(problem.meta["expression"]) == split
        assert problem.answer == str(safe_eval(problem.meta["expression"]))


@pytest.mark.parametrize(
    ("shares", "message"),
    [
        ((), "at least one"),
        (((1, 0.5), (6, 0.5)), r"mixture level 6 is not one of \[1, 2, 3, 4, 5\]"),
        (((1, 0.5), (1, 0.5)), r"names each level once, got levels \[1, 1\]"),
        (((1, 1.0), (2, 0.0)), "weight of level 2 must be a positive number, got 0.0"),
        (((1, -1.0),), "weight of level 1 must be a positive number"),
        (((1, math.nan),), "weight of level 1 must be a positive number, got nan"),
    ],
)
def test_a_bad_mixture_is_refused_naming_the_problem(shares, message):
    with pytest.raises(DataError, match=message):
        Mixture(shares)


def test_a_mixture_whose_level_runs_out_names_the_level():
    half_level_1 = Mixture(((1, 0.5), (2, 0.5)))  # level 1 has 175 test expressions
    with pytest.raises(DataError, match="level 1 ran out of 'test' problems"):
        make_split("test", 400, seed=0, difficulty=half_level_1)


@pytest.mark.parametrize("number", [0, 7, 13, 20, 42, 99, 100, 105, 999, 1000, 4005, 123_456])
def test_number_words_read_back_to_the_number(number):
    assert words_to_int(number_to_words(number)) == number


def test_asking_for_more_problems_than_the_difficulty_holds_says_what_to_do():
    tiny = Difficulty(min_operands=2, max_operands=2, max_operand=3, operators=("+",))
    with pytest.raises(DataError, match=r"found only \d+ distinct 'train' problems.*fewer"):
        make_split("train", 20, seed=0, difficulty=tiny)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"split": "validation"}, "unknown synthetic split"),
        ({"difficulty": 9}, "unknown difficulty level 9"),
        ({"difficulty": "huge"}, "unknown difficulty level 'huge'.*two_digit_sums"),
        ({"style": "latex"}, "unknown style"),
        ({"solution_format": "essay"}, "unknown solution format"),
    ],
)
def test_bad_arguments_are_named(arguments, message):
    with pytest.raises(DataError, match=message):
        make_split(**{"split": "train", "n": 3, **arguments})


def test_an_inconsistent_difficulty_is_refused():
    with pytest.raises(DataError, match="min_operands <= max_operands"):
        Difficulty(min_operands=4, max_operands=3, max_operand=10)
    with pytest.raises(DataError, match="min_operand <= max_operand"):
        Difficulty(min_operands=2, max_operands=2, min_operand=11, max_operand=10)
    with pytest.raises(DataError, match="operators"):
        Difficulty(min_operands=2, max_operands=3, max_operand=10, operators=("/",))
