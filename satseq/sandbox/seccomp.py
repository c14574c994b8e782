"""The seccomp filter: a classic-BPF program, built here and installed by the zygote.

Built by hand rather than with libseccomp so that the project needs no C library binding: the
program is small (one comparison per denied system call) and its tests read it back.

It denies, with EPERM:
- sockets of every family but AF_UNIX (so no inet, inet6, netlink or packet sockets);
- namespace and mount changes: unshare, setns, mount and the new mount API, pivot_root,
  chroot, and clone with any CLONE_NEW* flag;
- tracing other processes: ptrace, process_vm_readv/writev;
- IPC objects that outlive their processes: System V shared memory, semaphores and message
  queues, and POSIX message queues. A slot's namespaces last as long as its zygote, so such
  an object would carry one run's data into the next;
- kernel attack surface that code has no use for: bpf, keyctl and friends, perf_event_open,
  io_uring, userfaultfd, open_by_handle_at, module loading, kexec, reboot, swap, syslog, acct;
- changing another process's resource limits, priority or scheduling: prlimit64 and the
  sched_set* calls are allowed on the caller itself only (pid 0), setpriority and ioprio_set
  only for the caller itself (PRIO_PROCESS / IOPRIO_WHO_PROCESS and 0). A run has the uid of
  its zygote, which would otherwise pass the kernel's own check, and every later run of the
  slot would inherit what it set (a 60 MB address space, one CPU, nice 19, 200 files).
clone3 gets ENOSYS, because its flags sit behind a pointer that BPF cannot read; glibc then falls
back to clone, whose flags it can. A system call of another architecture (the 32-bit or x32
ABIs on x86_64) kills the process, because the numbers below would not mean the same there.
"""

from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass

# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_JSET_K = 0x45
BPF_RET_K = 0x06
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
OFFSET_NR = 0
OFFSET_ARCH = 4
OFFSET_ARG0_LOW = 16  # little-endian: the low 32 bits of args[0]

OFFSET_ARG1_LOW = 24

AF_UNIX = 1
PRIO_PROCESS = 0
IOPRIO_WHO_PROCESS = 1
X32_SYSCALL_BIT = 0x40000000
CLONE_NEW_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
)

SELF_ONLY_SYSCALLS = (
    "prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr",
)  # fmt: skip
"""Calls whose first argument is the target pid: allowed only with 0, the caller itself."""

DENIED_SYSCALLS = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "ptrace", "process_vm_readv", "process_vm_writev",
    "shmget", "semget", "msgget", "mq_open",
    "bpf", "keyctl", "add_key", "request_key", "perf_event_open",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd",
    "open_by_handle_at", "name_to_handle_at",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "syslog", "acct", "quotactl",
)  # fmt: skip


@dataclass(frozen=True)
class Architecture:
    """The audit arch value and system call numbers of one kernel ABI."""

    name: str
    audit_arch: int
    numbers: dict[str, int]
    x32: bool  # x86_64 kernels also accept x32 calls: nr | X32_SYSCALL_BIT


# From arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h (aarch64).
X86_64 = Architecture(
    "x86_64",
    0xC000003E,
    {
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321, "keyctl": 250,
        "add_key": 248, "request_key": 249, "perf_event_open": 298, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 323,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
        "reboot": 169, "swapon": 167, "swapoff": 168, "syslog": 103, "acct": 163,
        "quotactl": 179, "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240,
        "socket": 41, "socketpair": 53, "clone": 56, "clone3": 435, "prlimit64": 302,
        "sched_setaffinity": 203, "sched_setscheduler": 144, "sched_setparam": 142,
        "sched_setattr": 314, "setpriority": 141, "ioprio_set": 251,
    },
    x32=True,
)  # fmt: skip
AARCH64 = Architecture(
    "aarch64",
    0xC00000B7,
    {
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
        "chroot": 51, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280, "keyctl": 219,
        "add_key": 217, "request_key": 218, "perf_event_open": 241, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 282,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294,
        "reboot": 142, "swapon": 224, "swapoff": 225, "syslog": 116, "acct": 89,
        "quotactl": 60, "shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180,
        "socket": 198, "socketpair": 199, "clone": 220, "clone3": 435, "prlimit64": 261,
        "sched_setaffinity": 122, "sched_setscheduler": 119, "sched_setparam": 118,
        "sched_setattr": 274, "setpriority": 140, "ioprio_set": 30,
    },
    x32=False,
)  # fmt: skip
ARCHITECTURES = {arch.name: arch for arch in (X86_64, AARCH64)}


def host_architecture() -> Architecture | None:
    """The running kernel's ABI, or None where this filter has no system call table."""
    return ARCHITECTURES.get(platform.machine())


class _Assembler:
    """Collects BPF instructions whose jump targets are labels, then resolves them."""

    def __init__(self) -> None:
        self.code: list[tuple[int, str | int, str | int, int]] = []
        self.labels: dict[str, int] = {}

    def load(self, offset: int) -> None:
        self.code.append((BPF_LD_W_ABS, 0, 0, offset))

    def jump(self, opcode: int, value: int, if_true: str | int, if_false: str | int) -> None:
        """Jump to `if_true` when the test holds; a label, or 0 for the next instruction."""
        self.code.append((opcode, if_true, if_false, value))

    def ret(self, value: int) -> None:
        self.code.append((BPF_RET_K, 0, 0, value))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        program = bytearray()
        for index, (opcode, if_true, if_false, value) in enumerate(self.code):
            offsets = [
                target if isinstance(target, int) else self.labels[target] - index - 1
                for target in (if_true, if_false)
            ]
            if not all(0 <= offset <= 255 for offset in offsets):
                raise ValueError(f"BPF jump out of range at instruction {index}: {offsets}")
            program += struct.pack("=HBBI", opcode, offsets[0], offsets[1], value)
        return bytes(program)


def _allow_only_with(asm: _Assembler, label: str, arguments: dict[int, int]) -> None:
    """At `label`: allow the call if each argument (its offset in seccomp_data: value) is equal,
    else fail it with EPERM. Only the low 32 bits are compared: every argument checked here is an
    int, which the kernel truncates to them. BPF jumps only forward, so each check ends in
    returns of its own."""
    asm.label(label)
    for offset, value in arguments.items():
        asm.load(offset)
        asm.jump(BPF_JEQ_K, value, 0, f"{label}_denied")
    asm.ret(SECCOMP_RET_ALLOW)
    asm.label(f"{label}_denied")
    asm.ret(SECCOMP_RET_ERRNO | errno.EPERM)


def build_filter(arch: Architecture) -> bytes:
    """The filter for `arch` as `struct sock_filter[]` bytes (8 bytes per instruction)."""
    eperm = SECCOMP_RET_ERRNO | errno.EPERM
    asm = _Assembler()
    asm.load(OFFSET_ARCH)
    asm.jump(BPF_JEQ_K, arch.audit_arch, "native", 0)
    asm.ret(SECCOMP_RET_KILL_PROCESS)
    asm.label("native")
    asm.load(OFFSET_NR)
    if arch.x32:
        asm.jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, "checked_abi")
        asm.ret(SECCOMP_RET_KILL_PROCESS)
        asm.label("checked_abi")
    for name in DENIED_SYSCALLS:
        asm.jump(BPF_JEQ_K, arch.numbers[name], "deny", 0)
    for name in SELF_ONLY_SYSCALLS:
        asm.jump(BPF_JEQ_K, arch.numbers[name], "self_pid", 0)
    asm.jump(BPF_JEQ_K, arch.numbers["setpriority"], "own_priority", 0)
    asm.jump(BPF_JEQ_K, arch.numbers["ioprio_set"], "own_io_priority", 0)
    asm.jump(BPF_JEQ_K, arch.numbers["socket"], "socket_family", 0)
    asm.jump(BPF_JEQ_K, arch.numbers["socketpair"], "socket_family", 0)
    asm.jump(BPF_JEQ_K, arch.numbers["clone"], "clone_flags", 0)
    asm.jump(BPF_JEQ_K, arch.numbers["clone3"], "no_clone3", 0)
    asm.ret(SECCOMP_RET_ALLOW)
    asm.label("deny")
    asm.ret(eperm)
    asm.label("no_clone3")
    asm.ret(SECCOMP_RET_ERRNO | errno.ENOSYS)
    _allow_only_with(asm, "self_pid", {OFFSET_ARG0_LOW: 0})
    _allow_only_with(asm, "own_priority", {OFFSET_ARG0_LOW: PRIO_PROCESS, OFFSET_ARG1_LOW: 0})
    _allow_only_with(
        asm, "own_io_priority", {OFFSET_ARG0_LOW: IOPRIO_WHO_PROCESS, OFFSET_ARG1_LOW: 0}
    )
    _allow_only_with(asm, "socket_family", {OFFSET_ARG0_LOW: AF_UNIX})
    asm.label("clone_flags")
    asm.load(OFFSET_ARG0_LOW)
    asm.jump(BPF_JSET_K, CLONE_NEW_FLAGS, 0, "plain_clone")
    asm.ret(eperm)
    asm.label("plain_clone")
    asm.ret(SECCOMP_RET_ALLOW)
    return asm.assemble()
