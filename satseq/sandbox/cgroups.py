"""One cgroup per sandbox slot: memory, process and CPU limits, an OOM counter, a kill switch.

Both layouts are handled:
- cgroup v1 (this project's CI machine): one hierarchy per controller; the slot gets a
  directory in the memory, pids and (if mounted) cpu hierarchies, under the supervisor's own
  cgroup in each, so that it stays inside any limit the host put on us.
- cgroup v2: one directory under the supervisor's own cgroup. v2 only lets a cgroup hand
  controllers to children while it holds no processes itself, so this works where the
  controllers have been delegated (e.g. a systemd unit with Delegate=yes); otherwise the cgroup
  layer is reported as missing, with that reason.

The supervisor joins a run's first process to the slot cgroup (`join_files`) before it execs
bubblewrap, so every process of the run is counted from its first fork.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from abc import ABC, abstractmethod
from pathlib import Path

CPU_PERIOD_US = 100_000
V1_CONTROLLERS = ("memory", "pids", "cpu")
REQUIRED = ("memory", "pids")


class CgroupUnavailable(Exception):
    """No writable cgroup with the memory and pids controllers; the message says why."""


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _read_counters(path: Path) -> dict[str, int]:
    """A flat-keyed file such as memory.events ("oom_kill 3" a line) as {key: value}."""
    counters = {}
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        counters[name] = int(value)
    return counters


class SlotCgroup(ABC):
    """The cgroup directories of one slot, one per hierarchy (one in total on v2)."""

    version: int
    PINNED_MEMORY_KEYS: tuple[str, str]  # anonymous and shared memory, in memory.stat

    def __init__(self, directories: dict[str, Path]) -> None:
        self.directories = directories  # controller (or "unified") -> directory

    @property
    def join_files(self) -> list[str]:
        """The cgroup.procs files a process writes "0" into to join the slot."""
        return sorted({str(directory / "cgroup.procs") for directory in self.directories.values()})

    @abstractmethod
    def set_limits(self, memory_mb: int, max_processes: int, cpus: float) -> None:
        """Cap memory (no swap), tasks (processes and threads) and CPU (in cores)."""

    @abstractmethod
    def oom_kills(self) -> int:
        """How many processes the kernel has OOM-killed in this cgroup since it was made."""

    @abstractmethod
    def _pids_dir(self) -> Path:
        """The directory with pids.current and the slot's full cgroup.procs."""

    @abstractmethod
    def _memory_stat(self) -> Path:
        """The slot's memory.stat."""

    def pinned_memory(self) -> int:
        """Bytes of anonymous and shared memory (tmpfs files, memory files) charged to the
        slot: what no reclaim can take back, unlike the page cache and the kernel's caches."""
        counters = _read_counters(self._memory_stat())
        return sum(counters[key] for key in self.PINNED_MEMORY_KEYS)

    def process_count(self) -> int:
        """Tasks charged to the slot, zombies included until they are reaped."""
        return int((self._pids_dir() / "pids.current").read_text())

    def processes(self) -> list[int]:
        return [int(pid) for pid in (self._pids_dir() / "cgroup.procs").read_text().split()]

    def kill_all(self) -> None:
        """SIGKILL every process in the slot. A killed process cannot fork any more, so a few
        passes empty even a fork bomb's cgroup."""
        for _ in range(1000):
            pids = self.processes()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)

    def remove(self) -> None:
        """Kill what is left and remove the directories; the slot is gone afterwards."""
        self.kill_all()
        for directory in self.directories.values():
            for _ in range(200):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last tasks finish exiting
                    time.sleep(0.005)


class CgroupV1(SlotCgroup):
    version = 1
    PINNED_MEMORY_KEYS = ("rss", "shmem")

    def set_limits(self, memory_mb: int, max_processes: int, cpus: float) -> None:
        memory = self.directories["memory"]
        limit = str(memory_mb * 1024 * 1024)
        # memory.limit_in_bytes may never exceed memory.memsw.limit_in_bytes (memory + swap):
        # raise memsw first when growing, lower it last when shrinking.
        files = [memory / "memory.limit_in_bytes"]
        memsw = memory / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            current = int(files[0].read_text())
            files = [memsw, files[0]] if int(limit) > current else [files[0], memsw]
        for path in files:
            _write(path, limit)
        _write(self.directories["pids"] / "pids.max", str(max_processes))
        if "cpu" in self.directories:
            _write(self.directories["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(self.directories["cpu"] / "cpu.cfs_quota_us", str(int(cpus * CPU_PERIOD_US)))

    def oom_kills(self) -> int:
        return _read_counters(self.directories["memory"] / "memory.oom_control").get("oom_kill", 0)

    def _pids_dir(self) -> Path:
        return self.directories["pids"]

    def _memory_stat(self) -> Path:
        return self.directories["memory"] / "memory.stat"


class CgroupV2(SlotCgroup):
    version = 2
    PINNED_MEMORY_KEYS = ("anon", "shmem")

    @property
    def path(self) -> Path:
        return self.directories["unified"]

    def set_limits(self, memory_mb: int, max_processes: int, cpus: float) -> None:
        _write(self.path / "memory.max", str(memory_mb * 1024 * 1024))
        if (self.path / "memory.swap.max").exists():
            _write(self.path / "memory.swap.max", "0")
        _write(self.path / "pids.max", str(max_processes))
        if (self.path / "cpu.max").exists():
            _write(self.path / "cpu.max", f"{int(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")

    def oom_kills(self) -> int:
        return _read_counters(self.path / "memory.events").get("oom_kill", 0)

    def _pids_dir(self) -> Path:
        return self.path

    def _memory_stat(self) -> Path:
        return self.path / "memory.stat"

    def kill_all(self) -> None:
        kill_file = self.path / "cgroup.kill"  # Linux 5.14+: one atomic write
        if kill_file.exists() and self.processes():
            _write(kill_file, "1")
        super().kill_all()


def _unescape(field: str) -> str:
    """Undo mountinfo's octal escapes (a space is written as \\040)."""
    return field.encode().decode("unicode_escape")


def cgroup_mounts(mountinfo: str) -> tuple[dict[str, tuple[Path, str]], tuple[Path, str] | None]:
    """From /proc/self/mountinfo: ({v1 controller: (mount point, mount root)}, v2 mount)."""
    v1: dict[str, tuple[Path, str]] = {}
    v2 = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, (fstype, _source, super_options) = left.split(), right.split()[:3]
        mount = (Path(_unescape(fields[4])), _unescape(fields[3]))
        if fstype == "cgroup2":
            v2 = mount
        elif fstype == "cgroup":
            for option in super_options.split(","):
                v1.setdefault(option, mount)
    return v1, v2


def own_cgroups(proc_cgroup: str) -> tuple[dict[str, str], str | None]:
    """From /proc/self/cgroup: ({v1 controller: path}, v2 path)."""
    v1: dict[str, str] = {}
    v2 = None
    for line in proc_cgroup.splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            v2 = path
        for controller in controllers.split(","):
            v1[controller] = path
    return v1, v2


def path_under_mount(mount: tuple[Path, str], own_path: str) -> Path:
    """Where cgroup `own_path` appears under `mount` (mount point, the hierarchy path it shows)."""
    point, root = mount
    relative = os.path.relpath(own_path, root) if own_path.startswith(root) else "."
    return point / relative


def create_slot_cgroup(name: str, proc_root: Path = Path("/proc/self")) -> SlotCgroup:
    """Make (or take over and empty) the slot cgroup `name` next to our own; v2 preferred.

    Raises:
        CgroupUnavailable: neither layout gives a writable memory + pids cgroup here.
    """
    v1_mounts, v2_mount = cgroup_mounts((proc_root / "mountinfo").read_text())
    v1_paths, v2_path = own_cgroups((proc_root / "cgroup").read_text())
    reasons = []
    cgroup: SlotCgroup | None = None
    if v2_mount is not None and v2_path is not None:
        try:
            cgroup = make_v2_cgroup(path_under_mount(v2_mount, v2_path) / name)
        except (CgroupUnavailable, OSError) as error:
            reasons.append(f"v2: {error}")
    if cgroup is None and all(controller in v1_mounts for controller in REQUIRED):
        try:
            cgroup = make_v1_cgroup(
                {
                    controller: path_under_mount(
                        v1_mounts[controller], v1_paths.get(controller, "/")
                    )
                    / name
                    for controller in V1_CONTROLLERS
                    if controller in v1_mounts
                }
            )
        except OSError as error:
            reasons.append(f"v1: {error}")
    elif cgroup is None:
        reasons.append("v1: the memory and pids controllers are not both mounted")
    if cgroup is None:
        raise CgroupUnavailable("; ".join(reasons))
    cgroup.kill_all()  # whatever a previous holder of this name left running
    return cgroup


def make_v1_cgroup(directories: dict[str, Path]) -> CgroupV1:
    """The slot's directory in each v1 hierarchy ({controller: directory}), made if missing."""
    for directory in directories.values():
        directory.mkdir(exist_ok=True)
    return CgroupV1(directories)


def make_v2_cgroup(directory: Path) -> CgroupV2:
    """The slot's v2 cgroup, made if missing, with memory, pids (and cpu) enabled for it.

    Raises:
        CgroupUnavailable: the parent lacks the controllers or cannot hand them down.
    """
    parent = directory.parent
    available = set((parent / "cgroup.controllers").read_text().split())
    missing = [controller for controller in REQUIRED if controller not in available]
    if missing:
        raise CgroupUnavailable(f"{parent} has no {'/'.join(missing)} controller")
    enabled = set((parent / "cgroup.subtree_control").read_text().split())
    wanted = [c for c in (*REQUIRED, "cpu") if c in available and c not in enabled]
    if wanted:
        try:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
        except OSError as error:
            raise CgroupUnavailable(
                f"cannot enable {wanted} for children of {parent} ({error.strerror}); the "
                "controllers must be delegated, e.g. a systemd unit with Delegate=yes"
            ) from None
    directory.mkdir(exist_ok=True)
    return CgroupV2({"unified": directory})
