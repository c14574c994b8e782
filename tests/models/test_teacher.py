"""The quickstart team's teachers: the carry format, their slips and wrong facts, and a warm-start
corpus that RL training and evaluation never meet."""

import itertools
import re

import pytest

from satseq.data import MathProblem, make_split
from satseq.data.synthetic import split_of
from satseq.models.corpus import carry_problems
from satseq.models.teacher import QUICKSTART_TEACHERS, Teacher, addends

SOLUTION = re.compile(r"(\d)\+(\d)=(\d+), (\d+)\+(\d+)=(\d+)\. \\boxed\{(\d+)\}")


def sums(n=400):
    return make_split("warmup", n, seed=0, difficulty="two_digit_sums", style="symbols")


def needs_carry(problem: MathProblem) -> bool:
    a, b = addends(problem)
    return a % 10 + b % 10 >= 10


def boxed(problem: MathProblem) -> str:
    return SOLUTION.fullmatch(problem.solution).group(7)


def test_a_perfect_teacher_writes_the_units_column_then_the_right_sum():
    for problem in sums():
        solved = Teacher().solve(problem)
        a_units, b_units, units, a, b, total, answer = SOLUTION.fullmatch(solved.solution).groups()
        a_value, b_value = addends(problem)
        assert (int(a_units), int(b_units)) == (a_value % 10, b_value % 10)
        assert int(units) == a_value % 10 + b_value % 10
        assert (int(a), int(b)) == (a_value, b_value)
        assert total == answer == solved.answer == problem.answer


def test_a_slip_forgets_the_carry_about_as_often_as_its_rate_and_only_where_there_is_one():
    teacher = Teacher(carry_slip=0.6, seed=3)
    slips = {p.problem_id: boxed(teacher.solve(p)) != p.answer for p in sums(1000)}
    carries = [p for p in sums(1000) if needs_carry(p)]
    assert not any(slips[p.problem_id] for p in sums(1000) if not needs_carry(p))
    assert sum(slips[p.problem_id] for p in carries) / len(carries) == pytest.approx(0.6, abs=0.06)
    for problem in carries:
        if slips[problem.problem_id]:
            assert int(boxed(teacher.solve(problem))) == int(problem.answer) - 10


def test_a_wrong_fact_is_one_too_high_in_either_order():
    teacher = Teacher(wrong_facts=((7, 8),))
    for a, b in ((17, 28), (48, 37)):
        problem = MathProblem(
            "p", f"Compute {a} + {b}.", str(a + b), meta={"expression": f"{a}+{b}"}
        )
        assert teacher.solve(problem).solution.startswith(f"{a % 10}+{b % 10}=16, ")
        assert boxed(teacher.solve(problem)) == str(a + b + 1)


def test_slips_are_fixed_by_the_teachers_seed():
    problems = sums(200)
    first = [Teacher(0.5, seed=1).solve(p).solution for p in problems]
    assert first == [Teacher(0.5, seed=1).solve(p).solution for p in problems]
    assert first != [Teacher(0.5, seed=2).solve(p).solution for p in problems]


def test_quickstart_teachers_share_the_slip_but_no_wrong_fact():
    assert len({teacher.carry_slip for teacher in QUICKSTART_TEACHERS}) == 1
    facts = [{frozenset(pair) for pair in t.wrong_facts} for t in QUICKSTART_TEACHERS]
    assert all(len(f) == 3 for f in facts)
    assert all(a.isdisjoint(b) for a, b in itertools.combinations(facts, 2))


def test_the_carry_corpus_is_warmup_only_so_rl_and_evaluation_never_meet_it():
    problems = carry_problems(QUICKSTART_TEACHERS[0])
    assert len(problems) == len({p.meta["expression"] for p in problems}) == 2400
    assert {split_of(p.meta["expression"]) for p in problems} == {"warmup"}


def test_only_sums_are_solved_and_rates_are_checked():
    with pytest.raises(ValueError, match="a \\+ b problems only"):
        Teacher().solve(MathProblem("p", "Compute 3 - 1.", "2", meta={"expression": "3-1"}))
    with pytest.raises(ValueError, match="carry_slip"):
        Teacher(carry_slip=1.5)
