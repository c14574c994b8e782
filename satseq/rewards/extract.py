"""Pull the final answer out of a model response.

The last `\\boxed{...}` (or `\\fbox{...}`) wins. When a response has no box, the configured
fallbacks are tried in order:

- `answer_colon`: "Answer: 42", "**Answer:** $\\frac{1}{2}$"
- `answer_is`: "the answer is 42", "The final answer is $x=2$."
- `last_number`: the last number in the text ("... so 1,000 people." -> "1000")

Every scan here takes time linear in the response length: it runs in the caller's process,
outside the verifier's deadline, so it must not be able to hang on a pathological response.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

# A box opener; `\boxed {x}` with a space is valid LaTeX, so whitespace is allowed.
_BOX_OPENER = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Grouping braces. `\\` is consumed first so that in `\\{` the brace still counts (a line break
# followed by a group), while `\{` and `\}` are literal set braces and never group.
_BRACE_TOKEN = re.compile(r"\\\\|\\[{}]|[{}]")

# What the text-anchored fallbacks accept as an answer: short inline math, or one short
# whitespace-free token (checked afterwards to hold a digit or a LaTeX command, which keeps
# "Final Answer: The final answer is 7" from yielding "The"). Every repetition is bounded and no
# two adjacent ones can trade characters, so that a response stuffed with anchors costs linear,
# not quadratic, time.
_MATH_TOKEN = r"(?P<answer>\$[^$]{1,200}\$|\\\(.{1,200}?\\\)|[^\s$]{1,200}(?![^\s$]))"
_ANSWER_COLON = re.compile(r"\banswer\s*(?:\*+\s*)?:[\s*]*" + _MATH_TOKEN, re.IGNORECASE)
_ANSWER_IS = re.compile(
    r"\bthe\s+(?:final\s+)?answer\s+is(?:\s*:)?[\s*]*" + _MATH_TOKEN, re.IGNORECASE
)
_LOOKS_LIKE_MATH = re.compile(r"[\d\\]")
# A sign only where it cannot be a binary minus ("5-3" ends in 3, not -3); thousands separators
# only in groups of exactly three digits, so a list "1,2,3" ends in 3.
_NUMBER = re.compile(r"(?:(?<![\w.)\]}])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?")


def _matching_braces(text: str) -> dict[int, int]:
    """Map the index of every grouping `{` in `text` to the index of its closing `}`."""
    closing: dict[int, int] = {}
    open_stack: list[int] = []
    for token in _BRACE_TOKEN.finditer(text):
        if token.group() == "{":
            open_stack.append(token.start())
        elif token.group() == "}" and open_stack:
            closing[open_stack.pop()] = token.start()
    return closing


def last_boxed(text: str) -> str | None:
    """The content of the last non-empty, closed `\\boxed{}` or `\\fbox{}` in `text`, or None.

    Nested braces are matched, so `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`. A box left
    unclosed (a truncated generation) is skipped in favour of an earlier closed one.
    """
    openers = list(_BOX_OPENER.finditer(text))
    if not openers:
        return None
    closing = _matching_braces(text)
    for opener in reversed(openers):
        open_brace = opener.end() - 1
        if open_brace in closing:
            content = text[open_brace + 1 : closing[open_brace]].strip()
            if content:
                return content
    return None


def _clean_token(token: str) -> str:
    """Strip Markdown bold, inline-math delimiters and sentence punctuation around an answer."""
    token = token.strip("*").rstrip(".,;:!")
    if token.startswith("$") and token.endswith("$"):
        token = token.strip("$")
    elif token.startswith("\\(") and token.endswith("\\)"):
        token = token[2:-2]
    return token.strip()


def _last_anchored(pattern: re.Pattern[str]) -> Callable[[str], str | None]:
    def find(text: str) -> str | None:
        # "\$5" is five dollars: the escaped dollar would otherwise read as inline math.
        text = text.replace("\\$", "")
        answers = (_clean_token(match.group("answer")) for match in pattern.finditer(text))
        found = [answer for answer in answers if _LOOKS_LIKE_MATH.search(answer)]
        return found[-1] if found else None

    return find


def _last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    return re.sub(r"[\s,]", "", numbers[-1])


FALLBACKS: dict[str, Callable[[str], str | None]] = {
    "answer_colon": _last_anchored(_ANSWER_COLON),
    "answer_is": _last_anchored(_ANSWER_IS),
    "last_number": _last_number,
}
"""Fallback extractors by the name that `reward.fallbacks` uses for them."""


DEFAULT_FALLBACKS = tuple(FALLBACKS)
"""Every fallback, in the order the module docstring lists them."""


def check_fallbacks(names: Iterable[str]) -> tuple[str, ...]:
    """Return `names` as a tuple, or raise ValueError naming any unknown fallback."""
    if isinstance(names, str):  # a single name would otherwise be read letter by letter
        raise ValueError(f"reward.fallbacks must be a list of names, got the string {names!r}")
    names = tuple(names)
    unknown = [name for name in names if name not in FALLBACKS]
    if unknown:
        raise ValueError(
            f"reward.fallbacks: unknown fallback(s) {unknown}; "
            f"choose from {list(FALLBACKS)} (an empty list means boxed answers only)"
        )
    return names


def extract_answer(text: str, fallbacks: Iterable[str] = ()) -> str | None:
    """The response's final answer: the last box, else the first fallback that finds one.

    Args:
        text: the model response.
        fallbacks: names from `FALLBACKS`, tried in order when there is no box.

    Returns:
        The answer's text (LaTeX or plain), or None when nothing was found.
    """
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    for name in fallbacks:
        answer = FALLBACKS[name](text)
        if answer:
            return answer
    return None
