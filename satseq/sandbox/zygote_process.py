"""The supervisor's handle on its slot's zygote (zygote.py): start it inside the sandbox, hand
it runs, and stop it, sweeping the slot.

The chain of processes is

    supervisor (root) -> [joins the slot cgroup, drops to the slot uid]
      -> bubblewrap -> zygote (installs Landlock + seccomp) -> one forked child per run

The zygote lives as long as it serves: the supervisor replaces it when it died, hung, or a
run left something behind (a process, a unix socket, memory), and sweeps the slot from
outside (by cgroup and by uid) and mounts fresh scratch directories before the new one
starts, so that nothing of the old one can touch the next run.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from satseq.sandbox.languages import program_path
from satseq.sandbox.slot import (
    SlotEnvironment,
    fresh_scratch,
    reap_children,
    release_scratch,
    wait_until,
)

PR_SET_PDEATHSIG = 1
SOURCES = tuple(
    Path(__file__).with_name(name) for name in ("zygote.py", "confine.py", "scratch.py")
)
"""The zygote and the modules it imports; the sandbox sees them side by side."""
SWEEP_TIMEOUT_S = 5.0
LEFTOVERS_TIMEOUT_S = 1.0
"""How long the unix-socket collector may take to free what a run left in flight."""
MEMORY_SLACK_BYTES = 8 * 1024 * 1024 + (os.cpu_count() or 1) * 64 * os.sysconf("SC_PAGE_SIZE")
"""How far above its baseline the slot's pinned memory may be between runs: the zygote's heap
grows a little, and the kernel batches memory counters per CPU (64 pages each). A run finds at
most this much less than its memory limit."""
MESSAGE_BYTES = 1 << 16
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
"""The device files a program may open; not all of /dev, which without bubblewrap is the
host's (with /dev/shm in it)."""
SYSTEM_READABLE = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")

_libc = ctypes.CDLL(None, use_errno=True)


class ZygoteFailed(Exception):
    """The zygote did not start, or is gone before it took a run (which then never ran)."""


def program_environment(env: SlotEnvironment) -> dict[str, str]:
    """The zygote's environment, which every run inherits."""
    return {
        "PATH": program_path(env.python),
        "HOME": env.workdir,
        "TMPDIR": "/tmp" if env.bwrap_command else env.workdir,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        # One thread per BLAS / OpenMP pool: the cgroup bounds memory and tasks, and a pool per
        # core would hit the task limit and oversubscribe the CPU quota.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMEXPR_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }


def zygote_setup(env: SlotEnvironment, probe: bool) -> dict[str, Any]:
    """The zygote's first message (see zygote.py); `probe` reports failing layers instead of
    refusing to start."""
    private = ["/tmp", "/dev/shm"] if env.bwrap_command else []  # else the host's, shared
    landlock = None
    if env.landlock:
        landlock = {
            "read": [*SYSTEM_READABLE, *env.readable, *(["/proc"] if env.bwrap_command else [])],
            "write": [env.workdir, *private],
            "devices": list(DEVICES),
        }
    return {
        "landlock": landlock,
        "seccomp": base64.b64encode(env.seccomp_filter).decode() if env.seccomp_filter else None,
        "probe": probe,
        "workdir": env.workdir,
        "scratch": [env.workdir, *private],
        "kill_all": env.uid_is_private,
    }


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


def collect_unix_garbage() -> None:
    """Set off the kernel's unix-socket garbage collector, which frees the sockets that only
    messages in flight still hold, in cycles no process can reach, and all those messages
    carry (memory files, listening sockets): closing any unix socket schedules it."""
    for end in socket.socketpair(socket.AF_UNIX):
        end.close()


def unix_sockets(pid: int) -> int:
    """How many unix sockets the network namespace of process `pid` holds."""
    with open(f"/proc/{pid}/net/unix") as table:
        return sum(1 for _ in table) - 1  # a header, then a line a socket


def first_child(pid: int) -> int:
    """The oldest child of process `pid`."""
    return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])


class ZygoteProcess:
    """One zygote, from its start to its `stop`; `layers` is what it installed, and after the
    stop `last_words` what it wrote to its stdout and stderr (its error, if it failed)."""

    def __init__(self, env: SlotEnvironment, probe: bool, timeout_s: float) -> None:
        """Start the zygote and wait for its setup answer.

        Raises:
            ZygoteFailed: it exited or said why it cannot serve (e.g. a layer failed outside a
                probe), or did not answer within `timeout_s`; it has been stopped.
        """
        self.env = env
        fresh_scratch(env)
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._output, output = os.pipe()  # its stdout and stderr: nothing, unless it fails
        os.set_blocking(self._output, False)
        try:
            self.process = subprocess.Popen(
                [*(env.bwrap_command or []), env.python, "-P", env.zygote, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                pass_fds=(theirs.fileno(),),
                cwd="/",
                env=program_environment(env),
                start_new_session=True,
                preexec_fn=_enter_slot(env),
            )
        except BaseException:
            self.control.close()
            os.close(self._output)
            raise
        finally:
            theirs.close()
            os.close(output)
        self._stopped = False
        self._memory_baseline: int | None = None  # pinned memory once it is ready to serve
        self.last_words = ""
        self.control.send(json.dumps(zygote_setup(env, probe)).encode())
        reply = json.loads(self._receive(timeout_s) or '{"error": "no answer"}')
        if "error" in reply:
            self.stop()
            raise ZygoteFailed(f"the zygote did not start: {reply['error']}{self.last_words}")
        self.layers: dict[str, Any] = reply["layers"]
        self._baseline = env.cgroup.process_count() if env.cgroup else 0
        if env.cgroup is not None:
            self._memory_baseline = env.cgroup.pinned_memory()
        # A process in the sandbox's own network namespace (bubblewrap's init), whose unix
        # sockets the next run would see; without bubblewrap the network is the host's.
        self._network_pid = first_child(self.process.pid) if env.bwrap_command else None

    def _receive(self, timeout_s: float) -> bytes:
        """The zygote's next message; b"" if it is gone or says nothing within `timeout_s`."""
        if not select.select([self.control], [], [], timeout_s)[0]:
            return b""
        try:
            return self.control.recv(MESSAGE_BYTES)
        except ConnectionError:
            return b""

    def alive(self) -> bool:
        return not self._stopped and self.process.poll() is None

    def submit(self, descriptors: list[int]) -> None:
        """Hand the zygote a run: spec, stdin, stdout, stderr and status descriptors. It
        answers at once, unless it is still emptying the directories after the last run.

        Raises:
            ZygoteFailed: it is gone; it has been stopped, and the run did not start.
        """
        with contextlib.suppress(OSError):  # gone: then _receive says so
            socket.send_fds(self.control, [b"run"], descriptors)
        if self._receive(SWEEP_TIMEOUT_S) != b"started":
            self.stop()
            raise ZygoteFailed(f"the zygote is gone{self.last_words}")

    def collect(self, kill: bool) -> bool:
        """Wait for the end of the run: "done" (the run swept and reported, the scratch
        directories reset), then the slot holding nothing but the zygote: no other process, no
        unix socket, no more memory than at its start. With `kill`, first tell the zygote to
        kill the run. If it does not answer in time, or the run left something, stop it (which
        sweeps the slot) and return False."""
        if kill:
            with contextlib.suppress(OSError):
                self.control.send(b"kill")
        done = self._receive(SWEEP_TIMEOUT_S) == b"done"
        if done and self.env.cgroup is not None:
            done = self.env.cgroup.process_count() == self._baseline
        if done:
            collect_unix_garbage()
            done = wait_until(self._at_baseline, LEFTOVERS_TIMEOUT_S)
        if not done:
            self.stop()
        return done

    def _at_baseline(self) -> bool:
        """Whether the sandbox holds no unix socket and the slot's memory is at its baseline."""
        if self._network_pid is not None and unix_sockets(self._network_pid) > 0:
            return False
        return self.env.cgroup is None or self._memory_at_baseline()

    def _memory_at_baseline(self) -> bool:
        pinned = self.env.cgroup.pinned_memory()
        return pinned <= self._memory_baseline + MEMORY_SLACK_BYTES

    def stop(self) -> None:
        """Kill the zygote and everything else in the slot, reap them all, and free what they
        held: the scratch tmpfs, and (waiting a while for it) what the runs left in flight."""
        if self._stopped:
            return
        self._stopped = True
        self.control.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.env.claim is not None:
            self.env.claim.kill_all()
        if self.env.cgroup is not None:
            self.env.cgroup.kill_all()
        self.process.wait()
        with contextlib.suppress(BlockingIOError):
            text = os.read(self._output, MESSAGE_BYTES).decode(errors="replace").strip()
            self.last_words = f"; it wrote: {text[-2000:]}" if text else ""
        os.close(self._output)
        if self.env.cgroup is not None:
            empty = wait_until(lambda: self.env.cgroup.process_count() == 0, SWEEP_TIMEOUT_S)
        elif self.env.claim is not None:
            empty = wait_until(lambda: not self.env.claim.has_processes(), SWEEP_TIMEOUT_S)
        else:
            empty = True  # neither a cgroup nor a uid tells us more than the process group did
            reap_children()
        if not empty:
            raise RuntimeError(f"processes of the slot survived {SWEEP_TIMEOUT_S} s of kill sweeps")
        release_scratch(self.env)
        if self._memory_baseline is not None:
            # What the runs left in flight is charged to the slot until the collector frees
            # it; a new zygote must not count it in its own baseline.
            collect_unix_garbage()
            wait_until(self._memory_at_baseline, SWEEP_TIMEOUT_S)
