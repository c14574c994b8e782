"""One run in a slot, from the supervisor's side: hand it to the zygote, watch, report.

The supervisor gives the zygote (zygote.py, through zygote_process.py) the run's spec, its
stdin, the write ends of two output pipes and a status file, and watches the pipes until the
zygote reports the run done, the deadline passes, or an output passes its limit; in the two
last cases it tells the zygote to kill the run. The zygote answers "done" only once every
process of the run is gone and the scratch directories are reset; if it does not, or the run
left memory or sockets behind (`ZygoteProcess.collect`), the supervisor stops it, sweeping
the slot, and the next run gets a new one. Only then are the outputs drained and the status
read. A run whose program could not start also stops its zygote.
"""

from __future__ import annotations

import base64
import json
import math
import os
import selectors
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from satseq.sandbox.languages import SOURCE_FILES, died_of_memory_error
from satseq.sandbox.slot import SlotEnvironment
from satseq.sandbox.zygote_process import ZygoteProcess

DRAIN_TIMEOUT_S = 0.5
READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class Job:
    """One run as the supervisor receives it; binary fields are base64 text."""

    language: str
    code: str
    timeout_s: float
    memory_mb: int
    max_output_bytes: int
    stdin: str = ""
    files: dict[str, str] = field(default_factory=dict)
    fetch_files: list[str] = field(default_factory=list)


class Capture:
    """The first `limit` bytes of one output pipe, and whether more came."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.overflowed = False

    def read(self, fd: int) -> bool:
        """Read what is available; False at end of file."""
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        room = self.limit - len(self.data)
        self.data += chunk[:room]
        self.overflowed |= len(chunk) > room
        return True

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def cpu_limit_s(timeout_s: float) -> int:
    """RLIMIT_CPU's soft limit: a backstop, since the wall-clock deadline comes first for a
    single-threaded program (a multi-threaded one can burn CPU time faster than wall time)."""
    return math.ceil(timeout_s) + 1


def run_spec(env: SlotEnvironment, job: Job) -> dict[str, Any]:
    """The zygote's instructions for `job` (see zygote.py)."""
    disk_bytes = env.disk_mb * 1024 * 1024
    cpu_s = cpu_limit_s(job.timeout_s)
    rlimits = {
        "CPU": [cpu_s, cpu_s + 1],  # SIGXCPU, then SIGKILL for a program that ignores it
        "FSIZE": [disk_bytes, disk_bytes],
        "NOFILE": [env.max_open_files, env.max_open_files],
        "CORE": [0, 0],
    }
    if env.uid_is_private:
        rlimits["NPROC"] = [env.max_processes, env.max_processes]
    if env.cgroup is None:
        # Only without a memory cgroup: RLIMIT_AS counts address space, not memory, and
        # breaks programs that reserve much more than they touch.
        memory_bytes = job.memory_mb * 1024 * 1024
        rlimits["AS"] = [memory_bytes, memory_bytes]
    source = SOURCE_FILES[job.language]
    return {
        "language": job.language,
        "source": source,
        "files": {source: base64.b64encode(job.code.encode()).decode(), **job.files},
        "fetch_files": job.fetch_files,
        "max_fetch_bytes": disk_bytes,  # no file in the sandbox's tmpfs can be larger
        "rlimits": rlimits,
    }


def _memfd(name: str, content: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _watch(done: int, captures: dict[int, Capture], deadline: float) -> str | None:
    """Wait until `done` is readable (None), the deadline passes ("timeout") or an output
    overflows ("output")."""
    with selectors.DefaultSelector() as selector:
        selector.register(done, selectors.EVENT_READ, None)
        for fd, capture in captures.items():
            selector.register(fd, selectors.EVENT_READ, capture)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            for key, _ in selector.select(remaining):
                if key.data is None:
                    return None
                if not key.data.read(key.fd):
                    selector.unregister(key.fd)
                if key.data.overflowed:
                    return "output"


def _drain(captures: dict[int, Capture]) -> None:
    """Read what the dead run left in the pipes."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    with selectors.DefaultSelector() as selector:
        for fd, capture in captures.items():
            selector.register(fd, selectors.EVENT_READ, capture)
        while selector.get_map() and (remaining := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(remaining):
                if not key.data.read(key.fd) or key.data.overflowed:
                    selector.unregister(key.fd)


def _read_status(fd: int) -> dict[str, Any] | None:
    """The zygote's status (see zygote.py), or None if it wrote none or garbage."""
    size = os.fstat(fd).st_size
    raw = os.pread(fd, size, 0) if size else b""
    try:
        status = json.loads(raw) if raw else None
    except ValueError:
        return None
    return status if isinstance(status, dict) else None


def _classify(reason: str | None, status: dict | None, oom: bool, stderr: str, cpu_limit: int):
    """(status, return code) of a finished run; the values of `types.Status`."""
    if reason == "timeout":  # the sandbox killed the run: no return code of its own
        return "timeout", None
    if reason == "output":
        return "output_limit", None
    return_code = status.get("exit_code") if status else None
    if oom:
        return "memory", return_code
    if status is None or status.get("error") or return_code is None:
        return "sandbox_error", return_code
    if return_code == -signal.SIGXCPU or (
        return_code == -signal.SIGKILL and status.get("cpu_s", 0.0) >= cpu_limit
    ):
        return "timeout", return_code
    if return_code == 0:
        return "ok", 0
    if died_of_memory_error(return_code, stderr):
        return "memory", return_code
    return "error", return_code


def run_job(zygote: ZygoteProcess, job: Job) -> dict[str, Any]:
    """Run `job` on the slot's zygote, whose cgroup limits are the job's already, and return
    the result as a dict (see `ExecutionResult`).

    Raises:
        ZygoteFailed: the zygote was gone before it took the job, which did not run.
    """
    env = zygote.env
    started = time.monotonic()
    oom_before = env.cgroup.oom_kills() if env.cgroup is not None else 0
    stdout_read, stdout_write = os.pipe()
    stderr_read, stderr_write = os.pipe()
    status_fd = os.memfd_create("satseq-status", os.MFD_CLOEXEC)
    handed = [
        _memfd("satseq-spec", json.dumps(run_spec(env, job)).encode()),
        _memfd("satseq-stdin", base64.b64decode(job.stdin)),
        stdout_write,
        stderr_write,
    ]
    try:
        try:
            zygote.submit([*handed, status_fd])
        finally:
            for fd in handed:
                os.close(fd)
        stdout, stderr = Capture(job.max_output_bytes), Capture(job.max_output_bytes)
        captures = {stdout_read: stdout, stderr_read: stderr}
        for fd in captures:
            os.set_blocking(fd, False)
        reason = _watch(zygote.control.fileno(), captures, started + job.timeout_s)
        ended = time.monotonic()
        reported = zygote.collect(kill=reason is not None)
        _drain(captures)
        status = _read_status(status_fd) if reported else None
    finally:
        for fd in (stdout_read, stderr_read, status_fd):
            os.close(fd)
    if status is not None and status.get("error"):
        zygote.stop()  # the program could not start: the zygote's state is suspect
    if reason is None and (stdout.overflowed or stderr.overflowed):
        reason = "output"
    oom = env.cgroup is not None and env.cgroup.oom_kills() > oom_before
    stderr_text = stderr.text()
    if status is None and reason is None and not oom:
        stderr_text += f"\nsandbox: no report from the zygote{zygote.last_words}"
    elif status is not None and status.get("error"):
        stderr_text += f"\nsandbox: {status['error']}"
    outcome, return_code = _classify(reason, status, oom, stderr_text, cpu_limit_s(job.timeout_s))
    return {
        "status": outcome,
        "return_code": return_code,
        "stdout": stdout.text(),
        "stderr": stderr_text,
        "truncated": stdout.overflowed or stderr.overflowed,
        "wall_time_s": round(ended - started, 4),
        "fetched_files": (status or {}).get("files", {}),
    }
