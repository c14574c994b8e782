"""Make the interpreter reachable for slot uids when it lives under a private directory.

A slot's code runs as an unprivileged uid, and so does bubblewrap, which resolves every bind
source with that uid's permissions. An interpreter under /root (pyenv, conda, uv's default
installs) is then unreachable, because /root is mode 0700.

The fix is local to the supervisor process, which is root and owns nothing else: it moves
into a private mount namespace, mounts a tmpfs over each blocking directory (/root), and binds
back, read-only, just the paths the sandbox needs. Its children, bubblewrap included, see
/root holding only the interpreter; the host's mount table does not change, and root's other
files are hidden from the sandbox even where bubblewrap is missing.
"""

from __future__ import annotations

import ctypes
import os
import stat
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _encode(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None):
    result = _libc.mount(
        _encode(source), _encode(target), _encode(fstype), ctypes.c_ulong(flags), _encode(data)
    )
    _check(result, f"mount {source} on {target}")


def blocking_ancestor(path: Path) -> Path | None:
    """The topmost directory above `path` that other users may not traverse, if any."""
    for ancestor in reversed(path.parents):
        if not os.stat(ancestor).st_mode & stat.S_IXOTH:
            return ancestor
    return None


def expose(paths: list[Path]) -> list[Path]:
    """Make every path in `paths` reachable by any uid, for this process and its children.

    Must run as root, before any thread is started (unshare acts on the calling thread only).
    Returns the directories that were covered (empty if every path was reachable already).
    """
    blocked: dict[Path, list[Path]] = {}
    for path in paths:
        ancestor = blocking_ancestor(path)
        if ancestor is not None:
            blocked.setdefault(ancestor, []).append(path)
    if not blocked:
        return []
    _check(_libc.unshare(ctypes.c_int(CLONE_NEWNS)), "unshare(CLONE_NEWNS)")
    # Without this, mounts below a shared mount point would propagate back to the host.
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    # Open the paths before they are hidden, to bind them back from /proc/self/fd. (Opened
    # after unshare: a bind source must be a mount of the caller's own namespace.)
    handles = {path: os.open(path, os.O_PATH) for group in blocked.values() for path in group}
    try:
        for ancestor, group in blocked.items():
            _mount("tmpfs", str(ancestor), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
            for path in group:
                path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                if stat.S_ISDIR(os.fstat(handles[path]).st_mode):
                    path.mkdir(exist_ok=True)
                else:
                    path.touch(exist_ok=True)
                source = f"/proc/self/fd/{handles[path]}"
                _mount(source, str(path), None, MS_BIND | MS_REC, None)
                _mount(None, str(path), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
    finally:
        for handle in handles.values():
            os.close(handle)
    return list(blocked)
