"""The seccomp filter, read back by a small classic-BPF interpreter, decides as documented.

The filter is also installed for real in every adversarial test (test_adversarial.py); here
each decision is checked on its own, for both architectures, without a kernel.
"""

import errno
import re
import struct
from pathlib import Path

import pytest

from satseq.sandbox import seccomp

AF_INET, AF_INET6, AF_NETLINK, AF_PACKET = 2, 10, 16, 17
CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17
CLONE_THREAD_FLAGS = 0x003D0F00  # what pthread_create passes: VM|FS|FILES|SIGHAND|THREAD|...
EPERM = seccomp.SECCOMP_RET_ERRNO | errno.EPERM
PRIO_PROCESS, PRIO_PGRP, PRIO_USER = 0, 1, 2
IOPRIO_WHO_PROCESS, IOPRIO_WHO_USER = 1, 3
ZYGOTE_PID = 2  # what a run finds as its parent, in the sandbox's pid namespace


def evaluate(program: bytes, arch: int, nr: int, arg0: int = 0, arg1: int = 0) -> int:
    """Run a filter on one system call: the seccomp return value."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, arg1, 0, 0, 0, 0)
    code = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    accumulator, pc = 0, 0
    while True:
        opcode, jump_true, jump_false, value = code[pc]
        if opcode == seccomp.BPF_LD_W_ABS:
            (accumulator,) = struct.unpack_from("=I", data, value)
            pc += 1
        elif opcode == seccomp.BPF_RET_K:
            return value
        else:
            taken = {
                seccomp.BPF_JEQ_K: accumulator == value,
                seccomp.BPF_JGE_K: accumulator >= value,
                seccomp.BPF_JSET_K: bool(accumulator & value),
            }[opcode]
            pc += 1 + (jump_true if taken else jump_false)


@pytest.fixture(params=sorted(seccomp.ARCHITECTURES), ids=str)
def arch(request):
    return seccomp.ARCHITECTURES[request.param]


def decide(arch, name, arg0=0, arg1=0):
    return evaluate(seccomp.build_filter(arch), arch.audit_arch, arch.numbers[name], arg0, arg1)


@pytest.mark.parametrize("family", [AF_INET, AF_INET6, AF_NETLINK, AF_PACKET])
def test_sockets_other_than_unix_are_denied(arch, family):
    assert decide(arch, "socket", family) == EPERM
    assert decide(arch, "socketpair", family) == EPERM


def test_unix_sockets_are_allowed(arch):
    assert decide(arch, "socket", seccomp.AF_UNIX) == seccomp.SECCOMP_RET_ALLOW


@pytest.mark.parametrize("name", seccomp.DENIED_SYSCALLS)
def test_listed_system_calls_are_denied(arch, name):
    assert decide(arch, name) == EPERM


def test_clone_with_a_namespace_flag_is_denied_and_plain_clone_allowed(arch):
    assert decide(arch, "clone", CLONE_NEWUSER | SIGCHLD) == EPERM
    assert decide(arch, "clone", CLONE_NEWNET) == EPERM
    assert decide(arch, "clone", SIGCHLD) == seccomp.SECCOMP_RET_ALLOW
    assert decide(arch, "clone", CLONE_THREAD_FLAGS) == seccomp.SECCOMP_RET_ALLOW


@pytest.mark.parametrize("name", seccomp.SELF_ONLY_SYSCALLS)
def test_limits_and_scheduling_can_be_set_on_the_caller_only(arch, name):
    assert decide(arch, name, 0) == seccomp.SECCOMP_RET_ALLOW
    assert decide(arch, name, ZYGOTE_PID) == EPERM


def test_priorities_can_be_set_for_the_caller_only(arch):
    assert decide(arch, "setpriority", PRIO_PROCESS, 0) == seccomp.SECCOMP_RET_ALLOW
    assert decide(arch, "setpriority", PRIO_PROCESS, ZYGOTE_PID) == EPERM
    assert decide(arch, "setpriority", PRIO_PGRP, 0) == EPERM
    assert decide(arch, "setpriority", PRIO_USER, 0) == EPERM  # every process of the uid
    assert decide(arch, "ioprio_set", IOPRIO_WHO_PROCESS, 0) == seccomp.SECCOMP_RET_ALLOW
    assert decide(arch, "ioprio_set", IOPRIO_WHO_PROCESS, ZYGOTE_PID) == EPERM
    assert decide(arch, "ioprio_set", IOPRIO_WHO_USER, 0) == EPERM


def test_clone3_reports_enosys_so_that_libc_falls_back_to_clone(arch):
    assert decide(arch, "clone3") == seccomp.SECCOMP_RET_ERRNO | errno.ENOSYS


def test_ordinary_system_calls_are_allowed(arch):
    program = seccomp.build_filter(arch)
    checked = (
        *seccomp.DENIED_SYSCALLS,
        *seccomp.SELF_ONLY_SYSCALLS,
        "clone3", "socket", "socketpair", "clone", "setpriority", "ioprio_set",
    )  # fmt: skip
    for nr in set(range(0, 460)) - {arch.numbers[name] for name in checked}:
        assert evaluate(program, arch.audit_arch, nr) == seccomp.SECCOMP_RET_ALLOW, nr


def test_another_abi_is_killed():
    program = seccomp.build_filter(seccomp.X86_64)
    i386 = 0x40000003
    assert evaluate(program, i386, 1) == seccomp.SECCOMP_RET_KILL_PROCESS
    x32_read = seccomp.X32_SYSCALL_BIT | 0
    assert (
        evaluate(program, seccomp.X86_64.audit_arch, x32_read) == seccomp.SECCOMP_RET_KILL_PROCESS
    )


HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),
}


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_system_call_numbers_match_the_kernel_headers(name):
    header = HEADERS[name]
    if not header.exists():
        pytest.skip(f"{header} is not installed (Debian: linux-libc-dev)")
    text = header.read_text()
    for syscall, number in seccomp.ARCHITECTURES[name].numbers.items():
        match = re.search(rf"#define __NR(?:3264)?_{syscall}\s+(\d+)", text)
        assert match and int(match.group(1)) == number, syscall
