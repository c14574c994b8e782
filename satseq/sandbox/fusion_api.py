"""SandboxFusion's `/run_code` wire format, and its mapping to and from our request and result.

The models follow bytedance/SandboxFusion (sandbox/server/sandbox_api.py, runners/types.py).
Two optional fields are ours, and a SandboxFusion server ignores them:
- request `max_output_bytes`: the output limit, which SandboxFusion does not have;
- response `satseq`: our exact status (SandboxFusion has no memory or output-limit status),
  the truncation flag and the isolation level, from `satseq sandbox serve`.
Without the `satseq` field the status is derived from SandboxFusion's own fields.
"""

from __future__ import annotations

import base64
import binascii
from enum import StrEnum

from pydantic import BaseModel, Field

from satseq.sandbox.languages import SOURCE_FILES, died_of_memory_error
from satseq.sandbox.types import (
    ExecutionRequest,
    ExecutionResult,
    IsolationLevel,
    Status,
    sandbox_error,
)


class RunStatus(StrEnum):
    SUCCESS = "Success"  # every command finished with return code 0
    FAILED = "Failed"  # a non-zero return code or a time limit
    SANDBOX_ERROR = "SandboxError"  # the sandbox itself failed


class CommandRunStatus(StrEnum):
    FINISHED = "Finished"
    ERROR = "Error"
    TIME_LIMIT_EXCEEDED = "TimeLimitExceeded"


class CommandRunResult(BaseModel):
    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeRequest(BaseModel):
    compile_timeout: float = Field(10, description="compile timeout for compiled languages")
    run_timeout: float = Field(10, description="code run timeout")
    memory_limit_MB: int = Field(-1, description="maximum memory in MB; -1: the default")
    code: str
    stdin: str | None = None
    language: str
    files: dict[str, str | None] = Field(default_factory=dict, description="path -> base64")
    fetch_files: list[str] = Field(default_factory=list)
    max_output_bytes: int | None = Field(None, description="satseq extension; None: default")


class SatseqOutcome(BaseModel):
    """The `satseq` extension of a response."""

    status: Status
    truncated: bool = False
    isolation: IsolationLevel | None = None


class RunCodeResponse(BaseModel):
    status: RunStatus
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    satseq: SatseqOutcome | None = None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def to_fusion_request(
    request: ExecutionRequest,
    timeout_s: float,
    memory_mb: int,
    max_output_bytes: int,
    compile_timeout_s: float = 10.0,
) -> RunCodeRequest:
    """The wire form of `request`; the other arguments fill in limits it left to the default."""
    return RunCodeRequest(
        code=request.code,
        language=request.language,
        stdin=request.stdin,
        compile_timeout=compile_timeout_s,
        run_timeout=request.timeout_s or timeout_s,
        memory_limit_MB=request.memory_mb or memory_mb,
        files={name: _b64(data) for name, data in request.files.items()},
        fetch_files=request.fetch_files,
        max_output_bytes=request.max_output_bytes or max_output_bytes,
    )


def from_fusion_request(payload: RunCodeRequest) -> ExecutionRequest:
    """The request a `/run_code` call asks for.

    Raises:
        ValueError: an unsupported language, bad base64, or a limit out of range; the message
            says which (the server answers 422 with it).
    """
    if payload.language not in SOURCE_FILES:
        raise ValueError(
            f"unsupported language {payload.language!r}; this server runs {sorted(SOURCE_FILES)}"
        )
    files = {}
    for name, content in payload.files.items():
        if content is None:
            continue  # SandboxFusion skips these too
        try:
            files[name] = base64.b64decode(content, validate=True)
        except binascii.Error as error:
            raise ValueError(f"files[{name!r}] is not valid base64: {error}") from None
    return ExecutionRequest(
        code=payload.code,
        language=payload.language,
        stdin=payload.stdin or "",
        files=files,
        fetch_files=payload.fetch_files,
        timeout_s=payload.run_timeout,
        memory_mb=payload.memory_limit_MB if payload.memory_limit_MB > 0 else None,
        max_output_bytes=payload.max_output_bytes,
    )


def to_fusion_response(result: ExecutionResult) -> RunCodeResponse:
    """The `/run_code` answer for `result`, with our exact outcome in `satseq`."""
    if result.status == Status.SANDBOX_ERROR:
        run_status, status = CommandRunStatus.ERROR, RunStatus.SANDBOX_ERROR
    elif result.status == Status.TIMEOUT:
        run_status, status = CommandRunStatus.TIME_LIMIT_EXCEEDED, RunStatus.FAILED
    else:
        run_status = CommandRunStatus.FINISHED
        status = RunStatus.SUCCESS if result.status == Status.OK else RunStatus.FAILED
    return RunCodeResponse(
        status=status,
        message=result.stderr if status == RunStatus.SANDBOX_ERROR else "",
        run_result=CommandRunResult(
            status=run_status,
            execution_time=result.wall_time_s,
            return_code=result.return_code,
            stdout=result.stdout,
            stderr=result.stderr,
        ),
        files={name: _b64(data) for name, data in result.fetched_files.items()},
        satseq=SatseqOutcome(
            status=result.status, truncated=result.truncated, isolation=result.isolation
        ),
    )


def _truncate(text: str, max_bytes: int) -> tuple[str, bool]:
    encoded = text.encode()
    if len(encoded) <= max_bytes:
        return text, False
    return encoded[:max_bytes].decode(errors="ignore"), True


def _derived_status(response: RunCodeResponse) -> Status:
    """Our status from SandboxFusion's own fields (a server without the extension; its
    SandboxError answers never get here, `from_fusion_response` returns them first)."""
    results = [r for r in (response.compile_result, response.run_result) if r is not None]
    if any(r.status == CommandRunStatus.ERROR for r in results):
        return Status.SANDBOX_ERROR
    if any(r.status == CommandRunStatus.TIME_LIMIT_EXCEEDED for r in results):
        return Status.TIMEOUT
    if response.run_result is None:
        return Status.ERROR  # compilation failed, so nothing ran
    if response.run_result.return_code == 0 and response.status == RunStatus.SUCCESS:
        return Status.OK
    if died_of_memory_error(response.run_result.return_code, response.run_result.stderr or ""):
        return Status.MEMORY
    return Status.ERROR


def from_fusion_response(response: RunCodeResponse, max_output_bytes: int) -> ExecutionResult:
    """Our result for a `/run_code` answer; output beyond `max_output_bytes` is cut off and
    reported as `output_limit`, as the local backend does."""
    if response.status == RunStatus.SANDBOX_ERROR and response.satseq is None:
        return sandbox_error(f"SandboxFusion: {response.message}", "sandbox_fusion")
    run = response.run_result or response.compile_result
    stdout, stdout_cut = _truncate((run.stdout if run else None) or "", max_output_bytes)
    stderr, stderr_cut = _truncate((run.stderr if run else None) or "", max_output_bytes)
    if response.satseq is not None:
        status, truncated = response.satseq.status, response.satseq.truncated
        isolation = response.satseq.isolation
    else:
        status, truncated, isolation = _derived_status(response), False, None
    if stdout_cut or stderr_cut:
        truncated = True
        if status in (Status.OK, Status.ERROR):
            status = Status.OUTPUT_LIMIT
    return ExecutionResult(
        status=status,
        return_code=run.return_code if run else None,
        stdout=stdout,
        stderr=stderr if status != Status.SANDBOX_ERROR else stderr or response.message,
        truncated=truncated,
        wall_time_s=(run.execution_time if run else None) or 0.0,
        fetched_files={name: base64.b64decode(data) for name, data in response.files.items()},
        backend="sandbox_fusion",
        isolation=isolation,
    )
