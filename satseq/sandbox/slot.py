"""A slot's host-side resources: its uid claim, its cgroup, its scratch directories, and
sweeps; and `SlotEnvironment`, everything about a slot that shapes its runs.

A slot is one unit of concurrency of the local backend. Each is served by its own supervisor
process (supervisor.py), which holds these resources for its lifetime.

Uids are claimed host-wide with a lock file per uid, so that two backends on one machine (two
Ray actors, a test run next to a server) never share a uid: a shared uid would share
RLIMIT_NPROC, and each one's kill sweep would kill the other's runs. A lock held by a dead
process is released by the kernel, and the next claimant first kills whatever that uid left.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from satseq.sandbox import mount_namespace
from satseq.sandbox.cgroups import SlotCgroup

STATE_DIR = Path("/run/satseq-sandbox")
UID_RANGE = 1000  # uids tried from the configured base
INODES_PER_MB = 256
"""The inode cap of a scratch tmpfs: one file or directory per 4 KiB of its size, which keeps
the time to empty it between runs short (a few tenths of a second at most)."""


@dataclass(frozen=True)
class SlotEnvironment:
    """Everything about the slot that shapes a run; fixed after the supervisor's probe."""

    python: str  # as the sandbox sees it
    readable: list[str]  # the interpreter's directories, as the sandbox sees them
    bwrap_command: list[str] | None  # None: run without bubblewrap
    zygote: str  # the zygote script's path as the sandbox sees it
    workdir: str  # the working directory as the sandbox sees it
    scratch_mounts: list[Path]  # tmpfs the supervisor mounts afresh for each zygote (root only)
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
    def uid_is_private(self) -> bool:
        """Whether the uid the runs see holds only this slot's processes: a slot uid, or the
        fresh user namespace of bubblewrap. Only then does RLIMIT_NPROC count just the slot's
        processes, and kill(-1) reach just them."""
        return self.claim is not None or self.bwrap_command is not None


class UidClaim:
    """An exclusive claim on one unprivileged uid, held while the lock file stays open."""

    def __init__(self, uid: int, lock_fd: int) -> None:
        self.uid = uid
        self._lock_fd = lock_fd

    @classmethod
    def acquire(cls, uid_base: int, preferred: int, state_dir: Path = STATE_DIR) -> UidClaim:
        """Claim the first free uid from `preferred` on, wrapping within the range that
        starts at `uid_base`. A slot prefers the uid it had before a restart, so that the new
        supervisor cleans up (processes, cgroup) after the old one.

        Raises:
            RuntimeError: every uid of the range is taken or belongs to a real account.
        """
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for offset in range(UID_RANGE):
            uid = uid_base + (preferred - uid_base + offset) % UID_RANGE
            with contextlib.suppress(KeyError):
                pwd.getpwuid(uid)
                continue  # a real account: never borrow it
            lock_file = state_dir / f"uid-{uid}.lock"
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            claim = cls(uid, fd)
            claim.kill_all()  # leftovers of a previous claimant that died
            return claim
        raise RuntimeError(f"no free sandbox uid in {uid_base}..{uid_base + UID_RANGE - 1}")

    def kill_all(self) -> None:
        """SIGKILL every process of the uid: a child takes the uid and calls kill(-1), which
        reaches exactly the processes that uid may signal (all of its own) except the caller.
        The kernel walks the task list under a lock that fork needs, so none slips through."""
        child = os.fork()  # the supervisor is single-threaded, so fork is safe here
        if child == 0:
            try:
                os.setresgid(self.uid, self.uid, self.uid)
                os.setresuid(self.uid, self.uid, self.uid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(child, 0)

    def has_processes(self) -> bool:
        """Whether any process (zombies included) still runs as the uid; scans /proc."""
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(FileNotFoundError):
                    if entry.stat().st_uid == self.uid:
                        return True
        return False

    def release(self) -> None:
        os.close(self._lock_fd)


def reap_children() -> int:
    """Reap every child that has exited (the supervisor is a subreaper, so orphans of the runs
    are its children); returns how many."""
    reaped = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped += 1


def wait_until(condition, timeout_s: float) -> bool:
    """Poll `condition` (reaping as it goes) until it holds or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        reap_children()
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def fresh_scratch(env: SlotEnvironment) -> None:
    """Empty scratch directories for a new zygote: fresh tmpfs mounts where the supervisor
    mounts them, else a fresh working directory on the host (without bubblewrap, which
    otherwise mounts its own tmpfs)."""
    size_bytes, inodes = env.disk_mb * 1024 * 1024, env.disk_mb * INODES_PER_MB
    for path in env.scratch_mounts:
        mount_namespace.mount_tmpfs(path, size_bytes, inodes, env.uid)
    if not env.scratch_mounts and env.bwrap_command is None:
        fresh_directory(Path(env.workdir), env.uid)


def release_scratch(env: SlotEnvironment) -> None:
    """Unmount the supervisor's scratch tmpfs, freeing what the runs left in them."""
    for path in env.scratch_mounts:
        mount_namespace.unmount(path)


def fresh_directory(path: Path, uid: int | None) -> None:
    """Make `path` an empty directory, mode 0700, owned by `uid` (None: by us).

    rmtree does not follow symlinks, so whatever a run left there cannot point it elsewhere.
    """
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(mode=0o700, parents=True)
    if uid is not None:
        os.chown(path, uid, uid)
