"""Starting a local backend in a test (or skipping where this machine cannot), running code on
it, and finding its slots' cgroups and zygotes."""

import os
import textwrap
from pathlib import Path

import pytest

from satseq.sandbox import cgroups
from satseq.sandbox.isolation import SandboxUnavailable
from satseq.sandbox.local import LocalBackend, LocalSandboxSettings
from satseq.sandbox.types import ExecutionRequest, ExecutionResult


def start_backend(**settings) -> LocalBackend:
    """A local backend at the asked level.

    Only an unprivileged run skips: slot uids and cgroups need root. As root (how `make test`
    runs, after installing bubblewrap) a sandbox below the asked level is a failure, so the
    adversarial suite can never pass by not running.
    """
    try:
        return LocalBackend(LocalSandboxSettings(**settings))
    except SandboxUnavailable as error:
        if os.geteuid() == 0:
            raise
        pytest.skip(f"the sandbox's slot uids and cgroups need root: {error}")


def run(sandbox, code: str, **request) -> ExecutionResult:
    """Run `code` (dedented) on `sandbox`; `request` holds the other ExecutionRequest fields."""
    return sandbox.run(ExecutionRequest(code=textwrap.dedent(code), **request))


def slot_cgroup_dirs(uids: list[int]) -> list[Path]:
    """Where the slots' cgroups live (next to ours), whether or not they exist now."""
    v1_mounts, v2_mount = cgroups.cgroup_mounts(Path("/proc/self/mountinfo").read_text())
    v1_paths, v2_path = cgroups.own_cgroups(Path("/proc/self/cgroup").read_text())
    parents = [
        cgroups.path_under_mount(mount, v1_paths.get(controller, "/"))
        for controller, mount in v1_mounts.items()
        if controller in cgroups.V1_CONTROLLERS
    ]
    if v2_mount and v2_path:
        parents.append(cgroups.path_under_mount(v2_mount, v2_path))
    return [parent / f"satseq-sandbox-{uid}" for parent in parents for uid in uids]


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"\nPPid:\t{pid}\n" in (entry / "status").read_text():
                found.append(int(entry.name))
        except OSError:
            pass  # exited meanwhile
    return found


def zygote_pid(backend) -> int:
    """The zygote of a one-slot backend: the child of bubblewrap's init, the child of
    bubblewrap, the child of the supervisor."""
    (pid,) = backend.stats()["supervisor_pids"]
    for _ in range(3):
        (pid,) = children(pid)
    assert b"zygote.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return pid
