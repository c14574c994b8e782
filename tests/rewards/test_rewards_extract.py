"""Answer extraction: the last box wins, then the configured fallbacks in order."""

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from satseq.rewards import DEFAULT_FALLBACKS, extract_answer, last_boxed
from satseq.rewards.extract import check_fallbacks


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),  # nested braces
        ("$\\boxed{x^{2}+\\sqrt{y_{1}}}$", "x^{2}+\\sqrt{y_{1}}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped set braces do not group
        ("first \\boxed{1}, then \\boxed{2}", "2"),  # the last box wins
        ("\\fbox{7}", "7"),
        ("\\boxed {7}", "7"),
        ("\\boxed{\\boxed{5}}", "5"),
        ("\\boxed{3} and a truncated \\boxed{\\frac{4", "3"),  # an unclosed box is skipped
        ("\\boxed{3} and an empty \\boxed{ }", "3"),
    ],
)
def test_last_box_is_the_answer(response, answer):
    assert last_boxed(response) == answer
    assert extract_answer(response, DEFAULT_FALLBACKS) == answer


def test_box_beats_every_fallback():
    response = "Answer: 1. The answer is 2. \\boxed{3} and finally 4"
    assert extract_answer(response, DEFAULT_FALLBACKS) == "3"


@pytest.mark.parametrize(
    ("fallback", "response", "answer"),
    [
        ("answer_colon", "Working...\nAnswer: 42", "42"),
        ("answer_colon", "**Answer:** $\\frac{1}{2}$", "\\frac{1}{2}"),
        ("answer_colon", "answer: 3, no wait. ANSWER: -5.", "-5"),  # the last one wins
        ("answer_is", "So the answer is 7.", "7"),
        ("answer_is", "The final answer is $x=2$. I hope it is correct.", "x=2"),
        ("answer_is", "the answer is \\(\\sqrt{2}\\)", "\\sqrt{2}"),
        ("answer_is", "so the answer is \\$5.", "5"),
        ("last_number", "we get 12 apples, then 1,000 more.", "1000"),
        ("last_number", "5-3 = 2", "2"),  # a binary minus is not a sign
        ("last_number", "the result is -4", "-4"),
        ("last_number", "3 / 4 of them", "3/4"),
        ("last_number", "the list 1,2,3", "3"),
        ("last_number", "pi is about 3.14159", "3.14159"),
    ],
)
def test_each_fallback_without_a_box(fallback, response, answer):
    assert extract_answer(response, (fallback,)) == answer


def test_fallbacks_are_tried_in_the_configured_order():
    response = "Answer: 5. Later: the answer is 6. Total 7"
    assert extract_answer(response, ("answer_colon", "answer_is")) == "5"
    assert extract_answer(response, ("answer_is", "answer_colon")) == "6"
    assert extract_answer(response, ("last_number",)) == "7"


def test_prose_after_an_anchor_is_not_an_answer():
    minerva = "Final Answer: The final answer is 7. I hope it is correct."
    assert extract_answer(minerva, ("answer_colon",)) is None
    assert extract_answer(minerva, ("answer_colon", "answer_is")) == "7"


@pytest.mark.parametrize(
    ("response", "fallbacks"),
    [
        ("Answer: 42", ()),  # boxed only
        ("no numbers, no box", DEFAULT_FALLBACKS),
        ("the answer is unknown", ("answer_is",)),
        ("", DEFAULT_FALLBACKS),
    ],
)
def test_nothing_found_is_none(response, fallbacks):
    assert extract_answer(response, fallbacks) is None


# Box contents: text without backslashes, with balanced (possibly nested) braces.
_plain = st.text(alphabet="0123456789abxyz+-*/^=., ()", max_size=8)
_braced = st.recursive(_plain, lambda inner: st.builds("{{{}}}".format, inner), max_leaves=4)
_contents = (
    st.lists(st.one_of(_plain, _braced), min_size=1, max_size=4)
    .map("".join)
    .filter(lambda content: content.strip())
)


@given(
    prefixes=st.lists(st.text(alphabet="abc 123.,", max_size=10), min_size=1, max_size=4),
    contents=st.lists(_contents, min_size=1, max_size=4),
)
def test_the_last_box_wins_whatever_comes_before(prefixes, contents):
    response = "".join(
        f"{prefix}\\boxed{{{content}}}" for prefix, content in zip(prefixes, contents, strict=False)
    )
    written = contents[: len(prefixes)]
    assert last_boxed(response) == written[-1].strip()


@given(numbers=st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=5))
def test_last_number_is_the_last_integer_written(numbers):
    response = " then ".join(f"we have {n} items" for n in numbers)
    assert extract_answer(response, ("last_number",)) == str(numbers[-1])


def test_a_single_name_is_not_a_list_of_fallbacks():
    with pytest.raises(ValueError, match="list of names"):
        check_fallbacks("last_number")


def test_unknown_fallback_names_the_choices():
    with pytest.raises(
        ValueError, match=r"reward\.fallbacks: unknown fallback.*'last_word'.*'answer_colon'"
    ):
        check_fallbacks(["answer_colon", "last_word"])


ADVERSARIAL_RESPONSES = {
    "anchors_with_unclosed_math": "answer: \\( x " * 20_000,
    "anchors_with_unclosed_dollars": "the answer is $ y " * 20_000,
    "anchors_without_spaces": "answer:" * 40_000,
    "whitespace_after_anchor": "the answer is" + " " * 100_000 + "$",
    "whitespace_before_colon": "answer" + " " * 100_000 + "x",
    "unclosed_boxes": "\\boxed{" * 50_000,
    "deep_braces": "\\boxed{" + "{" * 100_000 + "}" * 100_000,
    "number_list": "1," * 100_000,
}


@pytest.mark.parametrize(
    "response", ADVERSARIAL_RESPONSES.values(), ids=ADVERSARIAL_RESPONSES.keys()
)
def test_extraction_stays_fast_on_adversarial_responses(response):
    # Extraction runs outside the verifier's deadline, so it must be linear in the length.
    start = time.perf_counter()
    extract_answer(response, DEFAULT_FALLBACKS)
    # quadratic scans took tens of seconds here; linear ones take ~0.1 s, ~1 s on a loaded CI
    assert time.perf_counter() - start < 5.0
