"""Pool hygiene: many runs back to back leave nothing behind, during or after the pool.

During the pool each slot keeps its zygote: bubblewrap, bubblewrap's init and the zygote, one
below the other under the slot's supervisor. Nothing else may run as a slot uid.
"""

import os
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from satseq.sandbox.types import ExecutionRequest, Status
from tests.sandbox.backends import slot_cgroup_dirs, start_backend

RUNS = 200
WORKERS = 8
ORPHANING_PROGRAM = """
import os, sys, time
if os.fork() == 0:  # an orphan in its own session, for the sweep to find
    os.setsid()
    time.sleep(30)
    os._exit(0)
print(sys.argv[0])
"""


def processes() -> list[dict[str, str]]:
    """Every process on the machine: pid, ppid, state and real uid."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = dict(
                line.split(":\t", 1) for line in (entry / "status").read_text().splitlines()
            )
        except (OSError, ValueError):
            continue  # exited meanwhile
        found.append(
            {
                "pid": entry.name,
                "ppid": status["PPid"],
                "state": status["State"][0],
                "uid": status["Uid"].split()[0],
            }
        )
    return found


def zygote_stacks(left: list[dict[str, str]], supervisors: set[str]) -> set[str]:
    """The pids of each supervisor's bubblewrap, bubblewrap's init and zygote."""
    children = defaultdict(set)
    for process in left:
        children[process["ppid"]].add(process["pid"])
    stacks, level = set(), supervisors
    for _ in range(3):
        level = {child for pid in level for child in children[pid]}
        stacks |= level
    return stacks


def test_two_hundred_runs_on_eight_workers_leave_no_process_zombie_or_cgroup():
    backend = start_backend(workers=WORKERS)
    stats = backend.stats()
    uids = {str(uid) for uid in stats["slot_uids"]}
    supervisors = {str(pid) for pid in stats["supervisor_pids"]}
    code = ORPHANING_PROGRAM
    try:
        assert any(path.is_dir() for path in slot_cgroup_dirs(stats["slot_uids"]))
        with ThreadPoolExecutor(WORKERS) as threads:
            results = list(threads.map(backend.run, [ExecutionRequest(code=code)] * RUNS))
        assert [r.status for r in results] == [Status.OK] * RUNS
        assert all(r.stdout == "main.py\n" for r in results)
        left = processes()
        stacks = zygote_stacks(left, supervisors)
        assert len(stacks) == 3 * WORKERS
        assert [p for p in left if p["uid"] in uids and p["pid"] not in stacks] == []
        parents = supervisors | {str(os.getpid())}
        assert [p for p in left if p["state"] == "Z" and p["ppid"] in parents] == []
    finally:
        backend.close()
    assert [p for p in processes() if p["pid"] in supervisors or p["uid"] in uids] == []
    assert [path for path in slot_cgroup_dirs(stats["slot_uids"]) if path.exists()] == []
