"""The slot supervisor: one process per slot that sets the slot up and runs its jobs, one at a
time, on behalf of the local backend.

Why a process per slot, rather than threads of the backend:
- it is a child subreaper (PR_SET_CHILD_SUBREAPER), so the orphans a run leaves become its
  children and it can reap them all with waitpid(-1), which would steal the exit statuses of
  unrelated children in a shared process (a Ray worker, the web server);
- it is single-threaded, so it may fork, unshare a mount namespace and use `preexec_fn`;
- a crash takes down one slot, which the backend restarts.

The supervisor runs as root where the backend does, to claim a uid, join the zygote to the
slot's cgroup and sweep; the runs themselves never do. It keeps one zygote (zygote.py) in the
sandbox, which forks each run, and replaces it whenever it is gone. It speaks protocol.py on
its stdin/stdout: first the slot settings, answered by the probe report, then one job per
frame, answered by one result each. It exits, cleaning up, when its stdin closes.

It imports no pydantic (start-up time): results are plain dicts whose "status" values are
those of `satseq.sandbox.types.Status`.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import traceback
from pathlib import Path
from typing import Any

from satseq.sandbox import bubblewrap, cgroups, mount_namespace, protocol, seccomp
from satseq.sandbox.isolation import Layer
from satseq.sandbox.runner import Job, run_job
from satseq.sandbox.slot import SlotEnvironment, UidClaim, wait_until
from satseq.sandbox.zygote_process import SOURCES, SWEEP_TIMEOUT_S, ZygoteFailed, ZygoteProcess

PR_SET_CHILD_SUBREAPER = 36
WORKDIR_ROOT = Path("/tmp/satseq-sandbox")


class Supervisor:
    """Holds one slot's resources and zygote; `probe` finds out which layers work, `run` runs
    a job."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.active: dict[Layer, str] = {}
        self.missing: dict[Layer, str] = {}
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            self.active[Layer.SUBREAPER] = "kill sweep after every run"
        else:
            self.missing[Layer.SUBREAPER] = os.strerror(ctypes.get_errno())
        self.claim: UidClaim | None = None
        self.exposure_error = ""
        mounts_scratch = False  # whether it mounts the scratch tmpfs, with an inode cap
        if os.geteuid() == 0:
            self.claim = UidClaim.acquire(settings["uid_base"], settings["preferred_uid"])
            self.active[Layer.SLOT_UID] = f"uid {self.claim.uid}"
            readable = [Path(path) for path in settings["readable"]] + list(SOURCES)
            try:
                mount_namespace.enter_private_namespace()
                mount_namespace.expose(bubblewrap.outermost(readable))
                mounts_scratch = True
            except OSError as error:  # e.g. a container without CAP_SYS_ADMIN
                self.exposure_error = f"; could not expose {readable} to the slot uid: {error}"
        else:
            self.missing[Layer.SLOT_UID] = "not running as root"
        owner = self.claim.uid if self.claim else os.getpid()
        self.cgroup: cgroups.SlotCgroup | None = None
        try:
            self.cgroup = cgroups.create_slot_cgroup(f"satseq-sandbox-{owner}")
            controllers = " ".join(self.cgroup.directories)
            self.active[Layer.CGROUP] = f"v{self.cgroup.version}: {controllers}"
        except (cgroups.CgroupUnavailable, OSError) as error:
            self.missing[Layer.CGROUP] = str(error)
        self.host_workdir = WORKDIR_ROOT / f"slot-{owner}"
        # Where it mounts each scratch directory's tmpfs, by the sandbox's path for it; empty
        # where bubblewrap mounts them (without an inode cap, which its options lack).
        self.scratch_mounts = {
            directory: self.host_workdir / Path(directory).name
            for directory in (bubblewrap.SCRATCH if mounts_scratch else ())
        }
        arch = seccomp.host_architecture()
        self.seccomp_filter = seccomp.build_filter(arch) if arch else None
        if arch is None:
            self.missing[Layer.SECCOMP] = f"no system call table for {os.uname().machine}"
        self.zygote: ZygoteProcess | None = None

    def _environment(self, bwrap: str | None, landlock: bool, seccomp_on: bool) -> SlotEnvironment:
        settings = self.settings
        readable = [Path(path) for path in settings["readable"]]
        if bwrap:
            seen_inside = bubblewrap.seen_inside
            command = bubblewrap.bwrap_command(
                bwrap, readable, list(SOURCES), settings["disk_mb"], self.scratch_mounts
            )
            workdir, scratch_mounts = bubblewrap.WORKDIR, list(self.scratch_mounts.values())
        else:  # the program sees the host's paths, and only its working directory is scratch
            seen_inside, command = Path, None
            workdir_mount = self.host_workdir / Path(bubblewrap.WORKDIR).name
            workdir = str(workdir_mount)
            scratch_mounts = [workdir_mount] if self.scratch_mounts else []
        return SlotEnvironment(
            python=str(seen_inside(Path(settings["python"]))),
            readable=[str(seen_inside(path)) for path in readable],
            bwrap_command=command,
            zygote=bubblewrap.in_sandbox(SOURCES[0]) if bwrap else str(SOURCES[0]),
            workdir=workdir,
            scratch_mounts=scratch_mounts,
            claim=self.claim,
            cgroup=self.cgroup,
            seccomp_filter=self.seccomp_filter if seccomp_on else None,
            landlock=landlock,
            disk_mb=settings["disk_mb"],
            max_processes=settings["max_processes"],
            max_open_files=settings["max_open_files"],
            cpus=settings["cpus"],
        )

    def _start_zygote(self, environment: SlotEnvironment, probe: bool) -> ZygoteProcess:
        return ZygoteProcess(environment, probe, self.settings["probe_timeout_s"])

    def _probe_zygote(self, environment: SlotEnvironment) -> ZygoteProcess:
        """A zygote on `environment` that has run a trivial program; it installed what it
        could of the layers (`layers`).

        Raises:
            ZygoteFailed: it did not start, or the program did not run.
        """
        zygote = self._start_zygote(environment, probe=True)
        probe = Job(
            language="python",
            code="import sys\n",
            timeout_s=self.settings["probe_timeout_s"],
            memory_mb=self.settings["memory_mb"],
            max_output_bytes=65536,
        )
        if self.cgroup is not None:
            self.cgroup.set_limits(*self._limits(probe))
        result = run_job(zygote, probe)
        if result["status"] != "ok":
            zygote.stop()
            raise ZygoteFailed(f"the probe program failed: {result['stderr'].strip()}")
        return zygote

    def probe(self) -> dict[str, Any]:
        """Start a zygote and run a trivial program on it, with bubblewrap if it works here,
        and report each layer as active (with a detail) or missing (with the reason). That
        zygote serves the runs, and its replacements install exactly the active layers."""
        seccomp_on = self.seccomp_filter is not None
        if not self.settings["bubblewrap"]:
            self.missing[Layer.BUBBLEWRAP] = "disabled in the backend settings"
        elif (path := shutil.which("bwrap")) is None:
            self.missing[Layer.BUBBLEWRAP] = "bwrap not found (Debian: package bubblewrap)"
        else:
            environment = self._environment(path, landlock=True, seccomp_on=seccomp_on)
            try:
                self.zygote = self._probe_zygote(environment)
                self.active[Layer.BUBBLEWRAP] = path
            except ZygoteFailed as error:
                self.missing[Layer.BUBBLEWRAP] = f"probe failed: {str(error)[-500:]}"
        if self.zygote is None:
            environment = self._environment(None, landlock=True, seccomp_on=seccomp_on)
            try:
                self.zygote = self._probe_zygote(environment)
            except ZygoteFailed as error:
                raise RuntimeError(
                    f"the sandbox cannot run a trivial program: {error}{self.exposure_error}"
                ) from None
        for layer in (Layer.LANDLOCK, Layer.SECCOMP):
            detail = self.zygote.layers.get(str(layer))
            if isinstance(detail, str):
                self.missing[layer] = detail
            elif detail is not None:
                self.active[layer] = f"abi {detail}" if layer == Layer.LANDLOCK else "filter"
        self.environment = self._environment(
            self.active.get(Layer.BUBBLEWRAP),
            landlock=Layer.LANDLOCK in self.active,
            seccomp_on=Layer.SECCOMP in self.active,
        )
        if self.environment.uid_is_private:
            limits = "CPU FSIZE NOFILE NPROC CORE" + ("" if self.cgroup else " AS")
            self.active[Layer.RLIMITS] = limits
        else:
            self.missing[Layer.RLIMITS] = "NPROC would count every process of our own uid"
        return {
            "pid": os.getpid(),
            "uid": self.environment.uid,
            "active": {str(k): v for k, v in self.active.items()},
            "missing": {str(k): v for k, v in self.missing.items()},
        }

    def run(self, job: Job) -> dict[str, Any]:
        """Run one job (see runner.py) on the zygote; a zygote that is gone is replaced first,
        and one found gone as the job is handed over is replaced and handed the job again."""
        if not self.zygote.alive():
            self._replace_zygote()
        if self.cgroup is not None:
            self._set_limits(job)
        try:
            return run_job(self.zygote, job)
        except ZygoteFailed:
            self._replace_zygote()
            return run_job(self.zygote, job)

    def _set_limits(self, job: Job) -> None:
        """The job's cgroup limits. The kernel refuses a memory limit below what the slot holds
        (EBUSY on cgroup v1): then the slot is reset, its zygote replaced, and the limits set
        once what it held is freed."""
        try:
            self.cgroup.set_limits(*self._limits(job))
        except OSError:
            self._replace_zygote()
            memory_limit = job.memory_mb * 1024 * 1024
            wait_until(lambda: self.cgroup.pinned_memory() < memory_limit, SWEEP_TIMEOUT_S)
            self.cgroup.set_limits(*self._limits(job))

    def _limits(self, job: Job) -> tuple[int, int, float]:
        """The slot cgroup's limits for `job`: memory (MB), tasks and CPUs."""
        return job.memory_mb, self.settings["max_processes"], self.settings["cpus"]

    def _replace_zygote(self) -> None:
        self.zygote.stop()
        self.zygote = self._start_zygote(self.environment, probe=False)

    def close(self) -> None:
        """Kill what is left of the slot, remove its cgroup and directory, free its uid."""
        if self.zygote is not None:
            self.zygote.stop()
        if self.claim is not None:
            self.claim.kill_all()
        if self.cgroup is not None:
            self.cgroup.remove()
        shutil.rmtree(self.host_workdir, ignore_errors=True)
        if self.claim is not None:
            self.claim.release()


def main() -> None:
    """Entry point of a supervisor process; see the module docstring for the protocol."""
    # Frames own the original stdin/stdout; anything printed by accident goes to stderr.
    requests, replies = os.dup(0), os.dup(1)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    settings = protocol.read_frame(requests)
    if settings is None:
        return
    supervisor = None
    try:
        supervisor = Supervisor(settings)
        report = supervisor.probe()
    except Exception as error:
        traceback.print_exc()
        protocol.write_frame(replies, {"error": f"{type(error).__name__}: {error}"})
        if supervisor is not None:
            supervisor.close()
        return
    protocol.write_frame(replies, report)
    try:
        while (message := protocol.read_frame(requests)) is not None:
            try:
                result = supervisor.run(Job(**message))
            except Exception as error:
                traceback.print_exc()
                result = {"status": "sandbox_error", "stderr": f"supervisor: {error!r}"}
            protocol.write_frame(replies, result)
    finally:
        supervisor.close()
