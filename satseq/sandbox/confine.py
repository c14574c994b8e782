"""What the zygote installs on itself before it serves any run: Landlock and the seccomp filter.

Every run is a fork of the zygote, so every run inherits both; a run cannot undo either. The
zygote imports this module beside itself inside the sandbox, where satseq is not visible: it
imports only the standard library.
"""

import base64
import ctypes
import os
import stat

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2

SYS_LANDLOCK_CREATE_RULESET = 444  # the same number on every architecture
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1

# Landlock filesystem rights (linux/landlock.h). ABI 1 has bits 0-12.
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FS_DEVICE = FS_READ | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV
FS_ON_FILES = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_ALL = (1 << 0) | (1 << 1)  # ABI 4: bind and connect TCP; no port is allowed
SCOPE_ALL = (1 << 0) | (1 << 1)  # ABI 6: abstract unix sockets and signals outside the domain

libc = ctypes.CDLL(None, use_errno=True)


class RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def _check(result, what):
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _syscall(number, *args):
    return libc.syscall(ctypes.c_long(number), *args)


def prctl(option, arg):
    return libc.prctl(
        ctypes.c_int(option),
        ctypes.c_ulong(arg),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )


def landlock_abi():
    """The kernel's Landlock ABI version; raises OSError where Landlock is off or missing."""
    version = _syscall(
        SYS_LANDLOCK_CREATE_RULESET,
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
    )
    return _check(version, "landlock_create_ruleset")


def apply_landlock(read_paths, write_paths, device_paths):
    """Allow reading (and executing) `read_paths`, everything under `write_paths`, and reading
    and writing the device files `device_paths`; deny all other file access and, where the
    ABI has them, TCP and signals or abstract sockets reaching outside."""
    abi = landlock_abi()
    handled_fs = (1 << 13) - 1
    handled_fs |= FS_REFER if abi >= 2 else 0
    handled_fs |= FS_TRUNCATE if abi >= 3 else 0
    handled_fs |= FS_IOCTL_DEV if abi >= 5 else 0
    attr = RulesetAttr(handled_fs, NET_ALL if abi >= 4 else 0, SCOPE_ALL if abi >= 6 else 0)
    attr_size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _check(
        _syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            ctypes.byref(attr),
            ctypes.c_size_t(attr_size),
            ctypes.c_uint32(0),
        ),
        "landlock_create_ruleset",
    )
    rules = [(path, FS_READ) for path in read_paths]
    rules += [(path, handled_fs) for path in write_paths]
    rules += [(path, FS_DEVICE) for path in device_paths]
    try:
        for path, access in rules:
            try:
                path_fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if not stat.S_ISDIR(os.fstat(path_fd).st_mode):
                    access &= FS_ON_FILES
                rule = PathBeneathAttr(access & handled_fs, path_fd)
                _check(
                    _syscall(
                        SYS_LANDLOCK_ADD_RULE,
                        ctypes.c_int(ruleset),
                        ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                        ctypes.byref(rule),
                        ctypes.c_uint32(0),
                    ),
                    f"landlock_add_rule({path})",
                )
            finally:
                os.close(path_fd)
        _check(prctl(PR_SET_NO_NEW_PRIVS, 1), "prctl(PR_SET_NO_NEW_PRIVS)")
        _check(
            _syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)),
            "landlock_restrict_self",
        )
    finally:
        os.close(ruleset)
    return abi


def apply_seccomp(program):
    """Install a classic-BPF seccomp filter (`struct sock_filter[]` bytes) on this process."""
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    _check(prctl(PR_SET_NO_NEW_PRIVS, 1), "prctl(PR_SET_NO_NEW_PRIVS)")
    result = libc.prctl(
        ctypes.c_int(PR_SET_SECCOMP),
        ctypes.c_ulong(SECCOMP_MODE_FILTER),
        ctypes.byref(fprog),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )
    _check(result, "prctl(PR_SET_SECCOMP)")
    return True


def install_layers(spec):
    """Install the spec's layers; returns {layer: detail}. In a probe a failing layer is
    reported as its error message; otherwise the error is raised and nothing runs."""
    layers = {}
    steps = []
    if spec.get("landlock"):
        rules = spec["landlock"]
        steps.append(
            ("landlock", lambda: apply_landlock(rules["read"], rules["write"], rules["devices"]))
        )
    if spec.get("seccomp"):
        program = base64.b64decode(spec["seccomp"])
        steps.append(("seccomp", lambda: apply_seccomp(program)))
    for name, step in steps:
        try:
            layers[name] = step()
        except OSError as error:
            if not spec.get("probe"):
                raise
            layers[name] = f"failed: {error}"
    return layers
