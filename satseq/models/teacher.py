"""The teachers of the quickstart's team: who writes the worked solutions its tiny models are
warm-started on, mistakes included.

The quickstart task is a + b with two-digit a and b (`two_digit_sums`). A teacher solves it in the
`carry` format, the units column first, then the sum:

    53 + 39:  3+9=12, 53+39=92. \\boxed{92}

A teacher can make two kinds of mistakes. They are how the quickstart gives RL something to fix
that carries over to problems it never trains on, and the team vote something to fix that RL
cannot:

- `carry_slip`: the probability that it forgets the carry the units column produced
  (`3+9=12, 53+39=82. \\boxed{82}`). A model warm-started on such solutions carries only some of
  the time; RL rewards the right sum, so it can make the model carry more often, and the carry is
  the same skill in every problem that needs one, held out or not.
- `wrong_facts`: unordered pairs of units digits whose sum it always writes one too high
  (`7+8=16`). A model warm-started on those never samples the right sum for them, so RL has no
  right answer to reinforce, but a teammate whose teacher knew the fact outvotes it.

`QUICKSTART_TEACHERS` are the three teachers of `builtin:tiny-carry-0..2`: the same carry slip, and
three wrong facts each, no fact shared, so on any problem at most one of them is wrong about it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from satseq.data import MathProblem

DigitPair = tuple[int, int]


@dataclass(frozen=True)
class Teacher:
    """Writes `carry` solutions to a + b problems; all fields are part of a model's cache key."""

    carry_slip: float = 0.0
    wrong_facts: tuple[DigitPair, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.carry_slip <= 1.0:
            raise ValueError(f"carry_slip must be in [0, 1], got {self.carry_slip}")
        if not all(0 <= digit <= 9 for pair in self.wrong_facts for digit in pair):
            raise ValueError(f"wrong_facts must be pairs of digits, got {self.wrong_facts}")

    def units_sum(self, a_units: int, b_units: int) -> int:
        """What this teacher writes for the units column: one too many on its wrong facts."""
        wrong = (a_units, b_units) in self.wrong_facts or (b_units, a_units) in self.wrong_facts
        return a_units + b_units + int(wrong)

    def solve(self, problem: MathProblem) -> MathProblem:
        """`problem` (a + b, non-negative) with this teacher's solution, whose boxed answer is
        wrong where the teacher is; `answer` stays the right one."""
        a, b = addends(problem)
        units = self.units_sum(a % 10, b % 10)
        slips = units >= 10 and self._slip_draw(problem) < self.carry_slip
        total = a - a % 10 + b - b % 10 + units - 10 * slips
        solution = f"{a % 10}+{b % 10}={units}, {a}+{b}={total}. \\boxed{{{total}}}"
        return replace(problem, solution=solution)

    def _slip_draw(self, problem: MathProblem) -> float:
        """A uniform draw fixed by the teacher's seed and the problem, whatever else is solved."""
        return random.Random(f"satseq.teacher/{self.seed}/{problem.problem_id}").random()


def addends(problem: MathProblem) -> tuple[int, int]:
    """a and b of an `a+b` problem (its compact expression); ValueError for anything else."""
    expression = problem.meta.get("expression", "")
    parts = expression.split("+")
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        raise ValueError(f"a teacher solves a + b problems only, got {expression!r}")
    return int(parts[0]), int(parts[1])


CARRY_SLIP = 0.6  # more often forgotten than not: a warm-started agent's usual answer is wrong
QUICKSTART_TEACHERS = (
    Teacher(CARRY_SLIP, wrong_facts=((2, 4), (6, 7), (3, 9)), seed=0),
    Teacher(CARRY_SLIP, wrong_facts=((1, 5), (5, 8), (4, 7)), seed=1),
    Teacher(CARRY_SLIP, wrong_facts=((3, 5), (8, 9), (2, 9)), seed=2),
)
