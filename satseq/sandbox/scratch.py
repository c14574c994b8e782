"""The scratch directories between two runs: everything in them deleted, and the directories
themselves given back the metadata they had before the first run.

They are mount points (tmpfs), so they cannot be made anew; a run could otherwise pass data to
the next one in what it leaves on them: a mode, an extended attribute (user.*, an ACL), access
and modification times, an inode flag (chattr +d). Their change time cannot be set back; it
says when the last reset was.

Used by the zygote's clean-up process inside the sandbox, where satseq is not visible: it
imports only the standard library.
"""

import errno
import fcntl
import os
import shutil
import stat
import struct

FS_IOC_GETFLAGS = 0x80086601  # the same number on x86_64 and aarch64
FS_IOC_SETFLAGS = 0x40086602
FLAGS = struct.Struct("i")  # the kernel reads and writes an int, whatever the ioctl's size says


def flags_ioctl(path, request, flags=0):
    """FS_IOC_GETFLAGS or FS_IOC_SETFLAGS (`request`) on the directory `path`: the flags."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return FLAGS.unpack(fcntl.ioctl(fd, request, FLAGS.pack(flags)))[0]
    finally:
        os.close(fd)


def inode_flags(path):
    """The chattr flags of the directory `path`, or None where its filesystem has none."""
    try:
        return flags_ioctl(path, FS_IOC_GETFLAGS)
    except OSError:
        return None


def metadata(path):
    """What a run could change about the directory `path` itself and the next run read."""
    status = os.stat(path)
    return {
        "mode": stat.S_IMODE(status.st_mode),
        "times_ns": (status.st_atime_ns, status.st_mtime_ns),
        "flags": inode_flags(path),
        "xattrs": {name: os.getxattr(path, name) for name in os.listxattr(path)},
    }


def reset(path, original):
    """Empty the directory `path` and give it back its `original` metadata (see `metadata`).
    Raises OSError if it cannot be done."""
    os.chmod(path, 0o700)
    empty_directory(path)
    xattrs = {name: os.getxattr(path, name) for name in os.listxattr(path)}
    for name in xattrs.keys() - original["xattrs"].keys():
        os.removexattr(path, name)
    for name, value in original["xattrs"].items():
        if xattrs.get(name) != value:
            os.setxattr(path, name, value)
    if inode_flags(path) != original["flags"]:  # some filesystems refuse even a no-op set
        flags_ioctl(path, FS_IOC_SETFLAGS, original["flags"])
    os.chmod(path, original["mode"])
    os.utime(path, ns=original["times_ns"])  # last: each step before sets the change times


def empty_directory(path):
    """Delete everything under `path`, whatever the run did to the permissions inside. Raises
    OSError, deleting nothing, if a directory under it is another mount: emptying never crosses
    into one (the sandbox binds nothing there, so one would be a fault to report, not data)."""
    device = os.lstat(path).st_dev
    for root, directories, _ in os.walk(path):  # top-down: each directory opened before entered
        for name in directories:
            directory = os.path.join(root, name)
            status = os.lstat(directory)
            if stat.S_ISLNK(status.st_mode):
                continue
            if status.st_dev != device:
                raise OSError(errno.EXDEV, "another mount inside a scratch directory", directory)
            os.chmod(directory, 0o700)
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
