"""The text side of tool calls (design §5): finding the model's code, and writing the sandbox's
answer back in the form the model reads.

    code_blocks("Let me check. <code>```python\\nprint(7 + 9)\\n```</code>")  # ["print(7 + 9)"]
    interpreter_text(observation(result), max_length=512)  # "<interpreter>\\n16\\n</interpreter>"

Pure string functions: no model, no sandbox.
"""

from __future__ import annotations

import ast
import io
import re
import textwrap

from satseq.sandbox.types import ExecutionResult, Status
from satseq.tool_tags import CODE_CLOSE, CODE_OPEN, INTERPRETER_CLOSE, INTERPRETER_OPEN

MIN_TRUNCATED_LENGTH = 5  # "..." plus a character of head and tail

CODE_BLOCK = re.compile(re.escape(CODE_OPEN) + r"(.*?)" + re.escape(CODE_CLOSE), re.DOTALL)
# An opening fence with an optional language tag, the code, and an optional closing fence (a
# model that forgets to close its fence still means the code inside).
FENCED = re.compile(r"\A\s*```[^\n]*\n(.*?)\s*(?:```\s*)?\Z", re.DOTALL)

# Why a run that did not finish normally ended, in words the model can act on.
STATUS_NOTES = {
    Status.TIMEOUT: "TimeoutError: the code ran past the sandbox's time limit and was stopped.",
    Status.MEMORY: "MemoryError: the code used more memory than the sandbox allows.",
    Status.OUTPUT_LIMIT: "OutputLimitError: the code printed more than the sandbox allows "
    "and was stopped.",
}


def code_blocks(text: str) -> list[str]:
    """The code of every complete `<code>…</code>` block in `text`, in order, with Markdown
    fences and common indentation removed."""
    return [_strip_fences(block) for block in CODE_BLOCK.findall(text)]


def _strip_fences(block: str) -> str:
    fenced = FENCED.match(block)
    code = fenced.group(1) if fenced else block
    return textwrap.dedent(code).strip()


def print_last_expression(code: str) -> str:
    """`code` with its final expression statement's value shown as the Python REPL shows it
    (`sys.displayhook`: the repr, and nothing for None), so `x + 1` as a last line prints.

    Only when `ast` parses the code and its last top-level statement is an expression; anything
    else (`x = 1`, a loop, a syntax error) comes back unchanged, so the sandbox reports the
    model's own error, never one the wrapping made. `print(x)` is an expression whose value is
    None, so it still prints once.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in the source
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]
    start = _char_offset(code, last.lineno, last.col_offset)
    end = _char_offset(code, last.end_lineno, last.end_col_offset)
    # The doubled parentheses keep a bare tuple (`a, b`) one argument.
    return f"{code[:start]}__import__('sys').displayhook(({code[start:end]})){code[end:]}"


def _char_offset(code: str, lineno: int, byte_col: int) -> int:
    """Index into `code` of `ast`'s position (1-based line, UTF-8 byte column)."""
    # newline="" splits lines at \n, \r\n and \r only, as Python's tokenizer does.
    lines = io.StringIO(code, newline="").readlines()
    line_start = sum(len(line) for line in lines[: lineno - 1])
    return line_start + len(lines[lineno - 1].encode()[:byte_col].decode())


def observation(result: ExecutionResult) -> str:
    """What the model is shown of a run: its stdout, its stderr (a traceback, say), and why
    it was stopped when the sandbox stopped it."""
    parts = [result.stdout.rstrip("\n"), result.stderr.rstrip("\n")]
    if result.status is Status.SANDBOX_ERROR:
        parts = [f"SandboxError: the code could not be run: {result.stderr.strip()}"]
    elif result.status in STATUS_NOTES:
        parts.append(STATUS_NOTES[result.status])
    return "\n".join(part for part in parts if part)


def failure_observation(error: BaseException) -> str:
    """What the model is shown when the sandbox itself could not be asked (it died, say)."""
    return f"SandboxError: the code could not be run: {type(error).__name__}: {error}"


def interpreter_text(body: str, max_length: int) -> str:
    """`body` as the model reads tool output: `<interpreter>\\n…\\n</interpreter>`, with the
    body middle-truncated to `max_length` characters."""
    return f"{INTERPRETER_OPEN}\n{middle_truncate(body, max_length)}\n{INTERPRETER_CLOSE}"


def middle_truncate(text: str, max_length: int) -> str:
    """`text` if it fits in `max_length` characters, else its head and tail around a marker
    saying how much was cut, `max_length` characters at most.

    The head and tail each keep at least a quarter of `max_length`: the start of the output and
    the end of a traceback are what a reader needs.
    """
    if max_length < MIN_TRUNCATED_LENGTH:
        raise ValueError(f"max_length must be at least {MIN_TRUNCATED_LENGTH}, got {max_length}")
    if len(text) <= max_length:
        return text
    # Sized with the most digits the count can have, so the real marker is never longer.
    marker = _cut_marker(len(text))
    if len(marker) > max_length // 2:
        marker = "..."
    keep = max_length - len(marker)
    head, tail = (keep + 1) // 2, keep // 2
    if marker != "...":
        marker = _cut_marker(len(text) - keep)
    return text[:head] + marker + text[len(text) - tail :]


def _cut_marker(cut: int) -> str:
    return f"\n... [{cut} characters cut] ...\n"
