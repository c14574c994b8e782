"""Finding our cgroup in either layout, and writing limits as each layout wants them.

These use a fake cgroup tree in a temporary directory; the real v1 hierarchy of this machine
is exercised by the memory, fork-bomb and hygiene tests.
"""

from pathlib import Path

import pytest

from satseq.sandbox import cgroups

MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
PROC_CGROUP = """\
4:memory:/docker/abc/job
2:cpu,cpuacct:/
8:pids:/
0::/
"""


def test_mounts_and_own_cgroups_are_read_from_proc():
    v1, v2 = cgroups.cgroup_mounts(MOUNTINFO)
    assert v1["memory"] == (Path("/sys/fs/cgroup/memory"), "/docker/abc")
    assert v1["cpuacct"] == (Path("/sys/fs/cgroup/cpu,cpuacct"), "/")
    assert v2 == (Path("/sys/fs/cgroup/unified"), "/")
    paths, unified = cgroups.own_cgroups(PROC_CGROUP)
    assert paths["memory"] == "/docker/abc/job"
    assert unified == "/"
    # Our memory cgroup, seen through a mount of its ancestor /docker/abc:
    assert cgroups.path_under_mount(v1["memory"], paths["memory"]) == Path(
        "/sys/fs/cgroup/memory/job"
    )


def fake_v2(tmp_path: Path, controllers: str, enabled: str) -> Path:
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "cgroup.controllers").write_text(controllers)
    (parent / "cgroup.subtree_control").write_text(enabled)
    return parent


def test_v2_limits_are_written_to_the_slot_directory(tmp_path):
    parent = fake_v2(tmp_path, "cpu memory pids", "cpu memory pids")
    slot = cgroups.make_v2_cgroup(parent / "slot")
    for name in ("memory.max", "memory.swap.max", "pids.max", "cpu.max", "cgroup.procs"):
        (slot.path / name).write_text("")
    slot.set_limits(memory_mb=256, max_processes=64, cpus=0.5)
    assert (slot.path / "memory.max").read_text() == str(256 * 1024 * 1024)
    assert (slot.path / "memory.swap.max").read_text() == "0"
    assert (slot.path / "pids.max").read_text() == "64"
    assert (slot.path / "cpu.max").read_text() == "50000 100000"
    assert slot.join_files == [str(slot.path / "cgroup.procs")]


def test_v2_without_the_controllers_says_so(tmp_path):
    parent = fake_v2(tmp_path, "cpu io", "")
    with pytest.raises(cgroups.CgroupUnavailable, match="no memory/pids controller"):
        cgroups.make_v2_cgroup(parent / "slot")


def test_v2_oom_kills_are_read_from_memory_events(tmp_path):
    slot = cgroups.CgroupV2({"unified": tmp_path})
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 2\n")
    assert slot.oom_kills() == 2


@pytest.mark.parametrize(
    ("slot_class", "stat"),
    [
        (cgroups.CgroupV1, "cache 900\nrss 300\nshmem 20\nactive_file 700\ninactive_file 180\n"),
        (cgroups.CgroupV2, "anon 300\nfile 900\nshmem 20\nactive_file 700\nslab 4000\n"),
    ],
    ids=["v1", "v2"],
)
def test_pinned_memory_is_anonymous_and_shared_memory_not_caches(tmp_path, slot_class, stat):
    (tmp_path / "memory.stat").write_text(stat)
    slot = slot_class({"memory": tmp_path, "unified": tmp_path})
    assert slot.pinned_memory() == 300 + 20


@pytest.mark.parametrize(("current", "new"), [(256, 512), (512, 256)])
def test_v1_memory_limit_never_exceeds_the_memory_plus_swap_limit(
    tmp_path, monkeypatch, current, new
):
    directories = {name: tmp_path / name for name in ("memory", "pids", "cpu")}
    for directory in directories.values():
        directory.mkdir()
    memory = directories["memory"]
    mib = 1024 * 1024
    for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
        (memory / name).write_text(str(current * mib))
    original = cgroups._write

    def record(path, value):
        # The kernel refuses memory.limit_in_bytes > memory.memsw.limit_in_bytes.
        limit = int((memory / "memory.limit_in_bytes").read_text())
        memsw = int((memory / "memory.memsw.limit_in_bytes").read_text())
        if path.name == "memory.limit_in_bytes":
            assert int(value) <= memsw
        if path.name == "memory.memsw.limit_in_bytes":
            assert int(value) >= limit
        original(path, value)

    monkeypatch.setattr(cgroups, "_write", record)
    cgroups.make_v1_cgroup(directories).set_limits(memory_mb=new, max_processes=32, cpus=1.0)
    assert (memory / "memory.limit_in_bytes").read_text() == str(new * mib)
    assert (directories["pids"] / "pids.max").read_text() == "32"
    assert (directories["cpu"] / "cpu.cfs_quota_us").read_text() == "100000"
