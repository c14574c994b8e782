"""The languages a sandbox runs: the file that holds the code, and what the program finds.

Kept free of pydantic so that the slot supervisor, which starts often, imports it cheaply.
"""

from __future__ import annotations

import os

SOURCE_FILES: dict[str, str] = {"python": "main.py", "bash": "main.sh"}
"""The file, in the working directory, that holds a request's code for each language."""


def program_path(python: str) -> str:
    """PATH for the program: the interpreter's directory first, so `python` means ours."""
    return f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin"


def died_of_memory_error(return_code: int | None, stderr: str) -> bool:
    """Whether a Python program ended on an uncaught MemoryError: it prints the traceback,
    whose last line names the exception, and exits with status 1. This is how a memory limit
    shows up without a memory cgroup (RLIMIT_AS), and for a single absurd allocation."""
    last_line = stderr.rstrip().rpartition("\n")[2]
    return return_code == 1 and last_line.startswith("MemoryError")
