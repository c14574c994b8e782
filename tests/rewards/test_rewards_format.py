"""The SPO recipe's format rule: exactly one </think>, and no tool tags after it."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from satseq.rewards import RewardScorer, follows_think_format

TOOL_USE = "<code>print(6*7)</code><interpreter>\n42\n</interpreter>"


@pytest.mark.parametrize(
    ("response", "follows"),
    [
        ("<think>6*7=42</think>\\boxed{42}", True),
        (f"<think>let me compute {TOOL_USE}</think>\\boxed{{42}}", True),  # tools while thinking
        ("6*7=42</think>\\boxed{42}", True),  # the chat template may have opened the block
        ("<think>6*7=42 \\boxed{42}", False),  # never closed
        ("<think>a</think>b</think>\\boxed{42}", False),  # closed twice
        (f"<think>hmm</think>{TOOL_USE}\\boxed{{42}}", False),  # tool use after thinking
        ("<think>hmm</think>\\boxed{42}<interpreter>42</interpreter>", False),
    ],
)
def test_think_format_cases(response, follows):
    assert follows_think_format(response) is follows


_free_text = st.text(alphabet="abc 123<>/{}\\", max_size=20).filter(
    lambda text: "</think>" not in text and "<code>" not in text and "<interpreter>" not in text
)


@given(
    before=_free_text,
    after=_free_text,
    extra=st.sampled_from(["</think>", "<code>", "<interpreter>"]),
)
def test_any_extra_closing_or_tool_tag_after_thinking_breaks_the_format(before, after, extra):
    assert follows_think_format(f"{before}</think>{after}")
    assert not follows_think_format(f"{before}</think>{after}{extra}")


def test_format_rule_zeroes_a_correct_answer_only_when_enabled(scorer):
    response = f"<think>hmm</think>{TOOL_USE}\\boxed{{42}}"
    assert scorer.score("", response, "42") == 1.0
    with RewardScorer(format_rule=True, timeout_s=10.0) as strict:
        assert strict.score("", response, "42") == 0.0
        assert strict.score("", "<think>6*7</think>\\boxed{42}", "42") == 1.0
        batch = strict.score_batch(["", ""], [response, "<think></think>\\boxed{42}"], ["42", "42"])
    assert batch.scores == [0.0, 1.0]
    assert batch.n_format_violation == 1
