"""The bubblewrap command line: what the sandboxed program can see of the machine.

Inside, the program finds:
- the system (/usr and its /bin, /lib... links) and the interpreter's directories, read-only;
- a few files of /etc that programs read at start-up (the dynamic linker's cache, the time
  zone), and nothing else of /etc;
- its own /proc (its pid namespace), a minimal /dev, and size-limited tmpfs mounts at /tmp,
  /dev/shm and the working directory, the scratch directories, which are the only writable
  places; the supervisor mounts them (with an inode cap) where it can, else bubblewrap does;
- no network (a new, empty network namespace), no other user namespaces (--disable-userns),
  no capabilities, and no controlling terminal (--new-session, which blocks TIOCSTI).
One sandbox lasts as long as the slot's zygote, which runs in it: the slot's runs share its
namespaces one after another, and the zygote resets the scratch directories between them.
Nothing of the host is ever bound inside a scratch directory: an interpreter that lives in
one on the host (a venv in a checkout under /tmp) is shown under /run/satseq/host instead.
bubblewrap itself runs as the slot's uid, never as root: a root-run bubblewrap would leave the
program's processes charged to root, and root is exempt from RLIMIT_NPROC.
"""

from __future__ import annotations

import os
from pathlib import Path

WORKDIR = "/sandbox"
SCRATCH = (WORKDIR, "/tmp", "/dev/shm")
"""The writable directories, reset between runs."""
SCRIPTS = "/run/satseq"  # where the sandbox sees the zygote's scripts
RELOCATED = Path(SCRIPTS, "host")  # where it sees a host path that lies in a scratch directory
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_FILES = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime")


def outermost(paths: list[Path]) -> list[Path]:
    """`paths` without those that lie inside another one, in sorted order."""
    kept: list[Path] = []
    for path in sorted(set(paths)):
        if not any(path.is_relative_to(parent) for parent in kept):
            kept.append(path)
    return kept


def in_sandbox(script: Path) -> str:
    """Where the sandbox sees one of the scripts that `bwrap_command` shows it."""
    return f"{SCRIPTS}/{script.name}"


def seen_inside(path: Path) -> Path:
    """Where the sandbox sees a readable host path that `bwrap_command` shows it: at its own
    path, unless that lies in a scratch directory, which must hold nothing of the host."""
    if any(path.is_relative_to(directory) for directory in SCRATCH):
        return RELOCATED / path.relative_to("/")
    return path


def bwrap_command(
    bwrap: str,
    readable: list[Path],
    scripts: list[Path],
    disk_mb: int,
    scratch_mounts: dict[str, Path],
) -> list[str]:
    """The argv prefix that starts a command in a fresh sandbox, in the caller's environment.

    Args:
        bwrap: the bubblewrap executable.
        readable: host directories to show read-only at `seen_inside(path)` (the interpreter's).
        scripts: files on the host to show read-only at `in_sandbox(script)` (the zygote's).
        disk_mb: the size of each scratch tmpfs that bubblewrap mounts itself.
        scratch_mounts: {scratch directory: host tmpfs to bind there}; bubblewrap mounts a
            tmpfs of `disk_mb` at each scratch directory missing from it.
    """
    size = str(disk_mb * 1024 * 1024)
    command = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop", "ALL",
        "--hostname", "sandbox",
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    for name in SYSTEM_LINKS:
        host_path = Path("/", name)
        if host_path.is_symlink():
            command += ["--symlink", os.readlink(host_path), str(host_path)]
        elif host_path.is_dir():
            command += ["--ro-bind", str(host_path), str(host_path)]
    for name in ETC_FILES:
        command += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for script in scripts:
        command += ["--ro-bind", str(script), in_sandbox(script)]
    command += ["--proc", "/proc", "--dev", "/dev"]
    for directory in SCRATCH:
        if directory in scratch_mounts:
            command += ["--bind", str(scratch_mounts[directory]), directory]
        else:
            command += ["--size", size, "--tmpfs", directory]
    for path in outermost([p for p in readable if not p.is_relative_to("/usr")]):
        command += ["--ro-bind", str(path), str(seen_inside(path))]
    command += ["--remount-ro", "/", "--chdir", WORKDIR, "--"]
    return command
