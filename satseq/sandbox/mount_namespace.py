"""The supervisor's own mount namespace: the interpreter made reachable for slot uids, and the
slot's scratch directories mounted as size- and inode-capped tmpfs.

A slot's code runs as an unprivileged uid, and so does bubblewrap, which resolves every bind
source with that uid's permissions. An interpreter under /root (pyenv, conda, uv's default
installs) is then unreachable, because /root is mode 0700. bubblewrap's own tmpfs mounts have
a size but no inode cap, so a run could fill one with empty files.

The fix for both is local to the supervisor process, which is root and owns nothing else: it
moves into a private mount namespace, mounts a tmpfs over each blocking directory (/root) and
binds back, read-only, just the paths the sandbox needs; and it mounts the slot's scratch
tmpfs, which bubblewrap binds into the sandbox. Its children, bubblewrap included, see /root
holding only the interpreter; the host's mount table does not change, and root's other files
are hidden from the sandbox even where bubblewrap is missing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from pathlib import Path

CLONE_NEWNS = 0x00020000
MNT_DETACH = 2
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


def enter_private_namespace() -> None:
    """Move this process into a mount namespace of its own, whose mounts never reach the host.

    Must run as root, before any thread is started (unshare acts on the calling thread only).
    """
    _check(_libc.unshare(ctypes.c_int(CLONE_NEWNS)), "unshare(CLONE_NEWNS)")
    # Without this, mounts below a shared mount point would propagate back to the host.
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)


def expose(paths: list[Path]) -> list[Path]:
    """Make every path in `paths` reachable by any uid, for this process and its children,
    which must be in a private mount namespace (`enter_private_namespace`).

    Returns the directories that were covered (empty if every path was reachable already).
    """
    blocked: dict[Path, list[Path]] = {}
    for path in paths:
        ancestor = blocking_ancestor(path)
        if ancestor is not None:
            blocked.setdefault(ancestor, []).append(path)
    if not blocked:
        return []
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


def mount_tmpfs(path: Path, size_bytes: int, inodes: int, owner: int) -> None:
    """A fresh, empty tmpfs at `path` (made if missing) in place of any mounted there before:
    at most `size_bytes` of data and `inodes` files and directories, mode 0700, owned by the
    uid `owner`. Must run in a private mount namespace."""
    unmount(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    options = f"size={size_bytes},nr_inodes={inodes},mode=0700,uid={owner},gid={owner}"
    _mount("tmpfs", str(path), "tmpfs", MS_NOSUID | MS_NODEV, options)


def unmount(path: Path) -> None:
    """Detach the mount at `path`, if there is one; its memory is freed once no process uses
    it any more."""
    if _libc.umount2(str(path).encode(), ctypes.c_int(MNT_DETACH)) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):  # not a mount point, or no such path
            raise OSError(code, f"umount {path}: {os.strerror(code)}")
