"""Format rules that zero a response's reward whatever its answer."""

from __future__ import annotations

from satseq.tool_tags import CODE_OPEN, INTERPRETER_OPEN

THINK_END = "</think>"
# Tool calls and their outputs (design §5) belong to the reasoning, before the think block ends.
_TOOL_TAGS = (CODE_OPEN, INTERPRETER_OPEN)


def follows_think_format(response: str) -> bool:
    """The SPO recipe's rule: exactly one `</think>`, and no `<code>` or `<interpreter>` after it.

    A response that reopens tool use after its final answer section, or that closes its
    reasoning twice (or never), fails.
    """
    if response.count(THINK_END) != 1:
        return False
    after_thinking = response.split(THINK_END, 1)[1]
    return not any(tag in after_thinking for tag in _TOOL_TAGS)
