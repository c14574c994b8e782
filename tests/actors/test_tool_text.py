"""The text side of tool calls: code extraction, the REPL-style last line, tool output."""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from satseq.actors.tool_text import (
    code_blocks,
    failure_observation,
    interpreter_text,
    middle_truncate,
    observation,
    print_last_expression,
)
from satseq.sandbox.types import ExecutionResult


def test_code_blocks_are_found_in_order_with_fences_stripped():
    text = (
        "First <code>print(7 + 9)</code> then\n"
        "<code>\n```python\nx = 2\nprint(x)\n```\n</code>"
        "<code>```\n    indented = 1\n    print(indented)\n```</code>"
        "<code>```py\nprint('no closing fence')</code>"
        "<code>print('never closed')"
    )
    assert code_blocks(text) == [
        "print(7 + 9)",
        "x = 2\nprint(x)",
        "indented = 1\nprint(indented)",
        "print('no closing fence')",
    ]
    assert code_blocks("no code here </code>") == []


def run_python(code: str) -> str:
    """What `code` prints when run as a module."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<model code>", "exec"), {})
    return out.getvalue()


@pytest.mark.parametrize(
    ("code", "printed"),
    [
        ("7 + 9", "16\n"),
        ("x = 2; x * 3", "6\n"),
        ("x = 1", ""),  # the recipe's blind print(x = 1) was a syntax error
        ("print(5)", "5\n"),  # printed once, not followed by "None"
        ("'é' * 2  # a comment", "'éé'\n"),  # UTF-8 columns; the REPL shows a repr
        ("s = 'ü'; len(s)", "1\n"),
        ("1, 2", "(1, 2)\n"),
        ("(1 +\n 2)", "3\n"),
        ("x = 2\r\nx + 1", "3\n"),  # Windows line ends
        ("for i in range(2):\n    i", ""),  # only a top-level last expression is shown
        ("None", ""),
    ],
)
def test_print_last_expression_shows_the_value_as_a_repl_does(code, printed):
    assert run_python(print_last_expression(code)) == printed


def test_print_last_expression_leaves_code_it_cannot_parse_alone():
    for code in ("print(1", "x = = 1", "", "a\x00b"):
        assert print_last_expression(code) == code


def test_observation_shows_output_errors_and_why_the_sandbox_stopped_the_run():
    ok = ExecutionResult(status="ok", return_code=0, stdout="16\n", backend="local")
    assert interpreter_text(observation(ok), 512) == "<interpreter>\n16\n</interpreter>"
    error = ExecutionResult(
        status="error", return_code=1, stdout="partial\n", stderr="NameError: y\n", backend="local"
    )
    assert observation(error) == "partial\nNameError: y"
    timeout = ExecutionResult(status="timeout", stdout="started\n", backend="local")
    assert observation(timeout).startswith("started\nTimeoutError:")
    memory = ExecutionResult(status="memory", backend="local")
    assert observation(memory).startswith("MemoryError:")
    broken = ExecutionResult(status="sandbox_error", stderr="slot died", backend="local")
    assert observation(broken) == "SandboxError: the code could not be run: slot died"
    assert failure_observation(ConnectionError("pool gone")) == (
        "SandboxError: the code could not be run: ConnectionError: pool gone"
    )


def test_middle_truncate_keeps_head_and_tail_and_says_how_much_was_cut():
    text = "".join(f"line {i}\n" for i in range(100))
    short = middle_truncate(text, 100)
    assert len(short) <= 100
    assert short.startswith("line 0\nline 1\n")
    assert short.endswith("line 98\nline 99\n")
    # The marker names exactly how many characters it stands for.
    cut = int(short.split("... [")[1].split(" characters cut")[0])
    assert len(short) - len(f"\n... [{cut} characters cut] ...\n") == len(text) - cut
    with pytest.raises(ValueError, match="at least 5"):
        middle_truncate(text, 4)


@given(text=st.text(), max_length=st.integers(min_value=5, max_value=300))
def test_middle_truncate_bounds_the_length_and_keeps_a_quarter_at_each_end(text, max_length):
    short = middle_truncate(text, max_length)
    assert len(short) <= max_length
    if len(text) <= max_length:
        assert short == text
    else:
        quarter = max_length // 4
        assert short.startswith(text[:quarter])
        assert short.endswith(text[len(text) - quarter :])


@given(body=st.text(), max_length=st.integers(min_value=16, max_value=300))
def test_interpreter_text_wraps_a_bounded_body(body, max_length):
    text = interpreter_text(body, max_length)
    assert text.startswith("<interpreter>\n")
    assert text.endswith("\n</interpreter>")
    assert len(text) <= max_length + len("<interpreter>\n\n</interpreter>")
