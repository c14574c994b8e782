"""One run in a slot, from the supervisor's side: spawn, watch, kill, sweep, report.

The chain of processes is

    supervisor (root) -> [joins the slot cgroup, drops to the slot uid]
      -> bubblewrap -> launcher (installs Landlock + seccomp) -> the program

and the supervisor watches it with a pidfd and the two output pipes until it exits, the
deadline passes, or an output passes its limit. Then, whatever happened, it kills everything
left in the slot (by cgroup and by uid), waits until the slot is empty and reaped, and only
then reads the launcher's status, so that no process of one run can outlive it or touch the
next one.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import math
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from satseq.sandbox.cgroups import SlotCgroup
from satseq.sandbox.languages import (
    SOURCE_FILES,
    died_of_memory_error,
    program_argv,
    program_path,
)
from satseq.sandbox.slot import UidClaim, reap_children, wait_until

PR_SET_PDEATHSIG = 1
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
SWEEP_TIMEOUT_S = 5.0
DRAIN_TIMEOUT_S = 0.5
READ_CHUNK = 1 << 16
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
"""The device files a program may open; not all of /dev, which without bubblewrap is the
host's (with /dev/shm in it)."""
SYSTEM_READABLE = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")

_libc = ctypes.CDLL(None, use_errno=True)


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
    probe: bool = False  # report failing layers instead of refusing to run


@dataclass(frozen=True)
class SlotEnvironment:
    """Everything about the slot that shapes a run; fixed after the supervisor's probe."""

    python: str
    readable: list[str]  # the interpreter's directories
    bwrap_command: list[str] | None  # None: run without bubblewrap
    launcher: str  # the launcher's path as the sandbox sees it
    workdir: str  # the working directory as the sandbox sees it
    claim: UidClaim | None
    cgroup: SlotCgroup | None
    seccomp_filter: bytes | None
    landlock: bool
    disk_mb: int
    max_processes: int
    max_open_files: int
    cpus: float

    @property
    def uid(self) -> int | None:
        return self.claim.uid if self.claim else None

    @property
    def nproc(self) -> bool:
        """RLIMIT_NPROC counts a uid's processes (per user namespace): only a slot uid or a
        fresh user namespace makes it count just this run's."""
        return self.claim is not None or self.bwrap_command is not None


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


def launch_spec(env: SlotEnvironment, job: Job) -> dict[str, Any]:
    """The launcher's instructions for `job` (see launcher.py)."""
    in_bwrap = env.bwrap_command is not None
    disk_bytes = env.disk_mb * 1024 * 1024
    cpu_s = cpu_limit_s(job.timeout_s)
    rlimits = {
        "CPU": [cpu_s, cpu_s + 1],  # SIGXCPU, then SIGKILL for a program that ignores it
        "FSIZE": [disk_bytes, disk_bytes],
        "NOFILE": [env.max_open_files, env.max_open_files],
        "CORE": [0, 0],
    }
    if env.nproc:
        rlimits["NPROC"] = [env.max_processes, env.max_processes]
    if env.cgroup is None:
        # Only without a memory cgroup: RLIMIT_AS counts address space, not memory, and
        # breaks programs that reserve much more than they touch.
        memory_bytes = job.memory_mb * 1024 * 1024
        rlimits["AS"] = [memory_bytes, memory_bytes]
    landlock = None
    if env.landlock:
        private = ["/tmp", "/dev/shm"] if in_bwrap else []  # the host's are shared
        landlock = {
            "read": [*SYSTEM_READABLE, *env.readable, *(["/proc"] if in_bwrap else [])],
            "write": [env.workdir, *private],
            "devices": list(DEVICES),
        }
    source = base64.b64encode(job.code.encode()).decode()
    return {
        "argv": program_argv(job.language, env.python),
        "env": {
            "PATH": program_path(env.python),
            "HOME": env.workdir,
            "TMPDIR": "/tmp" if in_bwrap else env.workdir,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            # One thread per BLAS / OpenMP pool: the cgroup bounds memory and tasks, and a
            # pool per core would hit the task limit and oversubscribe the CPU quota.
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "NUMEXPR_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
        },
        "cwd": env.workdir,
        "files": {SOURCE_FILES[job.language]: source, **job.files},
        "fetch_files": job.fetch_files,
        "max_fetch_bytes": disk_bytes,  # no file in the sandbox's tmpfs can be larger
        "rlimits": rlimits,
        "landlock": landlock,
        "seccomp": base64.b64encode(env.seccomp_filter).decode() if env.seccomp_filter else None,
        "probe": job.probe,
    }


def _memfd(name: str, content: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _enter_slot(env: SlotEnvironment) -> Callable[[], None]:
    """The child's last steps before exec: join the cgroup, become the slot uid, and die with
    the supervisor. Safe as a preexec_fn because the supervisor has no threads."""
    join_files = env.cgroup.join_files if env.cgroup else []
    uid = env.uid

    def enter() -> None:
        for path in join_files:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, b"0")
            os.close(fd)
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        # After the uid change, which clears the parent-death signal.
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return enter


def _watch(process: subprocess.Popen, captures: dict[int, Capture], deadline: float) -> str | None:
    """Wait for exit (None), the deadline ("timeout") or an overflowing output ("output")."""
    pidfd = os.pidfd_open(process.pid)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(pidfd, selectors.EVENT_READ, None)
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
    finally:
        os.close(pidfd)


def _sweep(env: SlotEnvironment, process: subprocess.Popen) -> None:
    """Kill every process of the run and reap them all, orphans included."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    if env.claim is not None:
        env.claim.kill_all()
    if env.cgroup is not None:
        env.cgroup.kill_all()
    process.wait()
    if env.cgroup is not None:
        empty = wait_until(lambda: env.cgroup.process_count() == 0, SWEEP_TIMEOUT_S)
    elif env.claim is not None:
        empty = wait_until(lambda: not env.claim.has_processes(), SWEEP_TIMEOUT_S)
    else:
        empty = True  # neither a cgroup nor a uid tells us more than the process group did
        reap_children()
    if not empty:
        raise RuntimeError(f"processes of the run survived {SWEEP_TIMEOUT_S} s of kill sweeps")


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
    """The launcher's status (see launcher.py), or None if it wrote none or garbage."""
    size = os.fstat(fd).st_size
    raw = os.pread(fd, size, 0) if size else b""
    try:
        status = json.loads(raw) if raw else None
    except ValueError:
        return None
    return status if isinstance(status, dict) else None


def _classify(reason: str | None, status: dict | None, oom: bool, stderr: str, cpu_limit: int):
    """(status, return code) of a finished run; the values of `types.Status`."""
    return_code = status.get("exit_code") if status else None
    if reason == "timeout":
        return "timeout", return_code
    if reason == "output":
        return "output_limit", return_code
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


def run_job(env: SlotEnvironment, job: Job) -> dict[str, Any]:
    """Run `job` in the slot and return the result as a dict (see `ExecutionResult`)."""
    started = time.monotonic()
    deadline = started + job.timeout_s
    oom_before = 0
    if env.cgroup is not None:
        env.cgroup.set_limits(job.memory_mb, env.max_processes, env.cpus)
        oom_before = env.cgroup.oom_kills()
    spec_fd = _memfd("satseq-spec", json.dumps(launch_spec(env, job)).encode())
    stdin_fd = _memfd("satseq-stdin", base64.b64decode(job.stdin))
    status_fd = os.memfd_create("satseq-status", os.MFD_CLOEXEC)
    launcher = [env.python, "-I", "-S", env.launcher, str(spec_fd), str(status_fd)]
    try:
        process = subprocess.Popen(
            [*(env.bwrap_command or []), *launcher],
            stdin=stdin_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(spec_fd, status_fd),
            cwd="/",
            env=HOST_ENV,
            start_new_session=True,
            preexec_fn=_enter_slot(env),
        )
    finally:
        os.close(spec_fd)
        os.close(stdin_fd)
    try:
        stdout, stderr = Capture(job.max_output_bytes), Capture(job.max_output_bytes)
        captures = {process.stdout.fileno(): stdout, process.stderr.fileno(): stderr}
        for fd in captures:
            os.set_blocking(fd, False)
        reason = _watch(process, captures, deadline)
        ended = time.monotonic()
        _sweep(env, process)
        _drain(captures)
        process.stdout.close()
        process.stderr.close()
        status = _read_status(status_fd)
    finally:
        os.close(status_fd)
    if reason is None and (stdout.overflowed or stderr.overflowed):
        reason = "output"
    oom = env.cgroup is not None and env.cgroup.oom_kills() > oom_before
    stderr_text = stderr.text()
    if status is None and reason is None and not oom:
        stderr_text += f"\nsandbox: no report from the launcher (exit status {process.returncode})"
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
        **({"layers": (status or {}).get("layers", {})} if job.probe else {}),
    }
