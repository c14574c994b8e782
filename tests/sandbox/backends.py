"""Starting a local backend in a test (or skipping where this machine cannot), and finding
where its slots' cgroups live."""

import os
from pathlib import Path

import pytest

from satseq.sandbox import cgroups
from satseq.sandbox.isolation import SandboxUnavailable
from satseq.sandbox.local import LocalBackend, LocalSandboxSettings


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
