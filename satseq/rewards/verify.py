"""Decide whether two answers are mathematically equal, with math-verify.

math-verify parses LaTeX or plain answers into sympy and compares them numerically, symbolically,
and as sets, intervals, tuples or equations, so 1/2 = 0.5 = \\frac{1}{2}, \\{1,2\\} = \\{2,1\\}
and x=2 = 2 are decided here, not by string equality.

These functions run without any time bound: math-verify's own timeout is `signal.alarm`, which
only works in a process's main thread, and our scorers run in Ray actor threads and thread
pools. They are meant to be called through `satseq.rewards.bounded_process`, which runs them in a
helper process and kills it at the deadline (see `satseq.rewards.scorer`).
"""

from __future__ import annotations

import logging
from functools import lru_cache

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from sympy import Basic, Mul, Rational, UnevaluatedExpr

from satseq.rewards.extract import last_boxed

_EXTRACTION = (LatexExtractionConfig(), ExprExtractionConfig())
# latex2sympy writes "X%" as X * UnevaluatedExpr(1/100); math-verify then accepts X% == X/100.
_PERCENT_FACTOR = UnevaluatedExpr(Rational(1, 100))


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its timeout is off; ours is the helper process's deadline."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _logger_name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_logger_name).addFilter(_DropTimeoutDisabledWarning())


def _without_percent(parsed: Basic | str) -> Basic | str:
    """Read "X%" as X: the percent sign becomes a unit, as in MATH's "10\\%" answers."""
    if not isinstance(parsed, Basic):
        return parsed
    return parsed.replace(
        lambda node: isinstance(node, Mul) and _PERCENT_FACTOR in node.args,
        lambda node: Mul(*(arg for arg in node.args if arg != _PERCENT_FACTOR)),
    )


@lru_cache(maxsize=4096)  # a prompt's ground truth is verified against many responses
def parse_answer(answer: str, allow_percent: bool) -> tuple[Basic | str, ...]:
    """Parse one answer (LaTeX or plain, without `$` or a box) into math-verify's candidates.

    Returns math-verify's list as a tuple: the sympy expression when parsing succeeded, followed
    by the answer's normalised string. With `allow_percent`, "10%" equals both 10 and 0.1;
    without it, only 10.
    """
    parsed = parse(f"\\boxed{{{answer}}}", extraction_config=_EXTRACTION, parsing_timeout=None)
    if not allow_percent:
        parsed = [_without_percent(candidate) for candidate in parsed]
    return tuple(parsed)


def _verify(gold: tuple[Basic | str, ...], prediction: tuple[Basic | str, ...]) -> bool:
    return verify(list(gold), list(prediction), timeout_seconds=None)


def answer_matches(answer: str, ground_truth: str, allow_percent: bool) -> bool:
    """Whether the extracted `answer` equals `ground_truth`, which may itself hold a box."""
    gold_text = last_boxed(ground_truth) or ground_truth
    return _verify(parse_answer(gold_text, allow_percent), parse_answer(answer, allow_percent))


def answers_equivalent(first: str, second: str, allow_percent: bool) -> bool:
    """Whether two answers are the same, in either order.

    math-verify's comparison is not symmetric: a gold inequality `x \\le 3` matches a predicted
    interval `(-\\infty, 3]` but not the other way round. For voting between agents, neither
    answer is the reference, so the answers are equivalent when either order matches.
    """
    parsed_first = parse_answer(first, allow_percent)
    parsed_second = parse_answer(second, allow_percent)
    return _verify(parsed_first, parsed_second) or _verify(parsed_second, parsed_first)


def warm_up() -> None:
    """Build math-verify's regexes and ANTLR parser, so that a helper's first deadline is not
    spent on them (the first parse takes ~100 ms, later ones ~1 ms)."""
    answer_matches("\\frac{1}{2}", "0.5", allow_percent=True)
