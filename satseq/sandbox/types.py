"""What a sandbox is asked to run and what it reports back (design §6).

Both backends, the `/run_code` server and the `SandboxPool` actor speak these two models. A
request leaves its limits as `None` to take the backend's configured defaults.
"""

from __future__ import annotations

import posixpath
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from satseq.sandbox.isolation import IsolationLevel
from satseq.sandbox.languages import SOURCE_FILES

Language = Literal["python", "bash"]

MAX_TIMEOUT_S = 600.0
MAX_MEMORY_MB = 65536
MAX_OUTPUT_BYTES = 64 * 1024 * 1024
MIN_MEMORY_MB = 32  # below this the interpreter itself does not start
# The limits of a request that leaves them out, unless a backend is configured otherwise.
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_OUTPUT_BYTES = 65536


class Status(StrEnum):
    """How a run ended, from the caller's point of view."""

    OK = "ok"  # exit code 0
    ERROR = "error"  # non-zero exit code or killed by a signal the program brought on itself
    TIMEOUT = "timeout"  # wall-clock or CPU-time limit
    MEMORY = "memory"  # the memory limit: OOM-killed, or an uncaught MemoryError
    OUTPUT_LIMIT = "output_limit"  # stdout or stderr passed max_output_bytes; the run was killed
    SANDBOX_ERROR = "sandbox_error"  # the sandbox itself failed; the code may not have run


def check_relative_path(name: str) -> str:
    """Return `name` if it is a plain relative path inside the working directory, else raise."""
    if not name or "\x00" in name:
        raise ValueError(f"file name {name!r} is empty or contains a NUL byte")
    normalized = posixpath.normpath(name)
    if posixpath.isabs(name) or normalized == ".." or normalized.startswith("../"):
        raise ValueError(f"file name {name!r} must be relative and stay inside the working dir")
    if normalized == ".":
        raise ValueError(f"file name {name!r} names the working directory itself")
    return normalized


class ExecutionRequest(BaseModel):
    """One program to run. `files` are written into the working directory before the run;
    `fetch_files` are read back from it afterwards (missing ones are left out of the result)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64"
    )

    code: str
    language: Language = "python"
    stdin: str = ""
    files: dict[str, bytes] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)
    timeout_s: float | None = Field(None, gt=0.0, le=MAX_TIMEOUT_S)
    memory_mb: int | None = Field(None, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB)
    max_output_bytes: int | None = Field(None, ge=1, le=MAX_OUTPUT_BYTES)

    @field_validator("files")
    @classmethod
    def _relative_files(cls, files: dict[str, bytes]) -> dict[str, bytes]:
        return {check_relative_path(name): content for name, content in files.items()}

    @field_validator("fetch_files")
    @classmethod
    def _relative_fetch_files(cls, names: list[str]) -> list[str]:
        for name in names:
            check_relative_path(name)
        return names

    @model_validator(mode="after")
    def _source_file_is_reserved(self) -> ExecutionRequest:
        source = SOURCE_FILES[self.language]
        if source in self.files:
            raise ValueError(
                f"files may not contain {source!r}, which holds the {self.language} code"
            )
        return self


class ExecutionResult(BaseModel):
    """What happened. `return_code` follows `subprocess`: negative for a signal, `None` when the
    sandbox killed the run (timeout, output limit) before it ended by itself."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, ser_json_bytes="base64", val_json_bytes="base64"
    )

    status: Status
    return_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    wall_time_s: float = 0.0
    fetched_files: dict[str, bytes] = Field(default_factory=dict)
    backend: Literal["local", "sandbox_fusion"]
    isolation: IsolationLevel | None = Field(
        None, description="the level the run was contained at; None if the backend did not say"
    )


def sandbox_error(message: str, backend: Literal["local", "sandbox_fusion"]) -> ExecutionResult:
    """A result for a run the sandbox could not carry out; `message` goes to stderr."""
    return ExecutionResult(status=Status.SANDBOX_ERROR, stderr=message, backend=backend)
