"""The languages a sandbox runs: where the code is written and which command runs it.

Kept free of pydantic so that the slot supervisor, which starts often, imports it cheaply.
"""

from __future__ import annotations

import os

SOURCE_FILES: dict[str, str] = {"python": "main.py", "bash": "main.sh"}
"""The file, in the working directory, that holds a request's code for each language."""


def program_argv(language: str, python: str) -> list[str]:
    """The command that runs the code file of `language`, relative to the working directory.

    Args:
        python: the sandbox's Python interpreter, as an absolute path.
    """
    if language == "python":
        return [python, SOURCE_FILES["python"]]
    if language == "bash":
        return ["/bin/bash", SOURCE_FILES["bash"]]
    raise ValueError(f"unsupported language {language!r}; supported: {sorted(SOURCE_FILES)}")


def program_path(python: str) -> str:
    """PATH for the program: the interpreter's directory first, so `python` means ours."""
    return f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin"


def died_of_memory_error(return_code: int | None, stderr: str) -> bool:
    """Whether a Python program ended on an uncaught MemoryError: it prints the traceback,
    whose last line names the exception, and exits with status 1. This is how a memory limit
    shows up without a memory cgroup (RLIMIT_AS), and for a single absurd allocation."""
    last_line = stderr.rstrip().rpartition("\n")[2]
    return return_code == 1 and last_line.startswith("MemoryError")
