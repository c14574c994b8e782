"""Pool hygiene: many runs back to back leave nothing behind, during or after the pool."""

import os
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
        assert [p for p in left if p["uid"] in uids] == []
        parents = supervisors | {str(os.getpid())}
        assert [p for p in left if p["state"] == "Z" and p["ppid"] in parents] == []
    finally:
        backend.close()
    assert [p for p in processes() if p["pid"] in supervisors or p["uid"] in uids] == []
    assert [path for path in slot_cgroup_dirs(stats["slot_uids"]) if path.exists()] == []
