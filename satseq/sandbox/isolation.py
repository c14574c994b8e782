"""Isolation layers, the level they add up to, and the fail-closed check.

Each slot supervisor probes its layers at start-up by running a trivial program through the
whole stack (`Supervisor.probe`); this module turns the probes into one report, a level, and
the log line that says which layers are active.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class IsolationLevel(StrEnum):
    """How strongly a backend contains code; each level includes the ones before it.

    - `none`: a child process with wall-clock and output limits only.
    - `rlimits`: plus resource limits (CPU, file size, open files, processes, core dumps), a
      scrubbed environment, a subreaper and a kill sweep after every run.
    - `namespaces`: plus bubblewrap: no network, a private read-only view of the system, private
      size-limited /tmp and working directory, its own pid namespace.
    - `full`: plus a seccomp filter, Landlock, a cgroup per slot (memory, pids, cpu) and a
      dedicated uid per slot.
    """

    NONE = "none"
    RLIMITS = "rlimits"
    NAMESPACES = "namespaces"
    FULL = "full"

    @property
    def rank(self) -> int:
        return list(IsolationLevel).index(self)


class Layer(StrEnum):
    BUBBLEWRAP = "bubblewrap"  # namespaces, read-only system, private tmpfs, no network
    SECCOMP = "seccomp"  # system call filter (see seccomp.py)
    LANDLOCK = "landlock"  # file access limited to the system (read) and the workdir (write)
    CGROUP = "cgroup"  # memory, pids and cpu limits per slot, and its OOM counter
    SLOT_UID = "slot_uid"  # one unprivileged uid per slot, claimed host-wide
    RLIMITS = "rlimits"  # CPU, FSIZE, NOFILE, NPROC, CORE (AS without a memory cgroup)
    SUBREAPER = "subreaper"  # orphans are adopted and reaped, and the slot swept after each run


REQUIREMENTS: dict[IsolationLevel, frozenset[Layer]] = {
    IsolationLevel.NONE: frozenset(),
    IsolationLevel.RLIMITS: frozenset({Layer.RLIMITS, Layer.SUBREAPER}),
    IsolationLevel.NAMESPACES: frozenset({Layer.RLIMITS, Layer.SUBREAPER, Layer.BUBBLEWRAP}),
    IsolationLevel.FULL: frozenset(Layer),
}


class SandboxUnavailable(Exception):
    """The local sandbox cannot start, or not at the configured minimum isolation level."""


@dataclass(frozen=True)
class IsolationReport:
    """Which layers are active (with a detail, e.g. "abi 7") and why the others are not."""

    active: dict[Layer, str] = field(default_factory=dict)
    missing: dict[Layer, str] = field(default_factory=dict)

    @property
    def level(self) -> IsolationLevel:
        """The highest level whose layers are all active."""
        met = [level for level, needs in REQUIREMENTS.items() if needs <= self.active.keys()]
        return max(met, key=lambda level: level.rank)

    def describe(self) -> str:
        """One line for the log: the level, the active layers, then what is missing and why."""
        active = ", ".join(
            f"{layer} ({detail})" if detail else layer
            for layer, detail in sorted(self.active.items())
        )
        line = f"sandbox isolation: {self.level} [{active or 'no layers'}]"
        if self.missing:
            reasons = (f"{layer}: {reason}" for layer, reason in sorted(self.missing.items()))
            line += f"; missing: {'; '.join(reasons)}"
        return line


def combine(reports: list[IsolationReport]) -> IsolationReport:
    """The report for a pool: a layer counts as active only if it is active in every slot."""
    missing: dict[Layer, str] = {}
    for report in reports:
        missing.update(report.missing)
    active = {}
    for layer in reports[0].active.keys() - missing.keys():
        details = sorted({report.active[layer] for report in reports})
        active[layer] = details[0] if len(details) == 1 else f"{details[0]} .. {details[-1]}"
    return IsolationReport(active=active, missing=missing)


def require(report: IsolationReport, minimum: IsolationLevel) -> None:
    """Fail closed: raise if `report` is below `minimum`, naming what is missing and why."""
    if report.level.rank >= minimum.rank:
        return
    needed = REQUIREMENTS[minimum] - report.active.keys()
    reasons = "; ".join(
        f"{layer}: {report.missing.get(layer, 'not active')}" for layer in sorted(needed)
    )
    raise SandboxUnavailable(
        f"the local sandbox reaches isolation level {report.level!s}, below the configured "
        f"minimum sandbox.min_isolation={minimum!s}. Missing: {reasons}. Fix these (run as root "
        "for slot uids and cgroups; install bubblewrap), or lower sandbox.min_isolation."
    )
