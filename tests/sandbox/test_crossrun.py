"""One run leaves nothing for the next: in each test run A attacks and run B, the next run in
the same slot (a pool of one), checks. Consecutive runs in a slot may belong to different
callers (`satseq serve --tools`, `satseq sandbox serve`)."""

import base64
import os
import resource
import secrets
import subprocess
import sys
import threading

import pytest

from satseq.sandbox import seccomp
from satseq.sandbox.bubblewrap import SCRATCH
from satseq.sandbox.types import Status
from tests.sandbox.backends import run, slot_cgroup_dirs, start_backend, zygote_pid

# 1. Nothing of a run's data is in the memory the next run is forked from

MEMORY_SCAN = """
import os
NEEDLES = {needles!r}
found = set()
with open('/proc/self/maps') as maps:
    regions = [line.split() for line in maps]
memory = os.open('/proc/self/mem', os.O_RDONLY)
for addresses, permissions, *_ in regions:
    start, end = (int(address, 16) for address in addresses.split('-'))
    if not permissions.startswith('r'):
        continue
    try:
        data = os.pread(memory, end - start, start)
    except OSError:
        continue  # [vvar] and the like
    # A needle is looked for as its two halves back to back, which this program never
    # builds: a hit is a copy that came from outside.
    for name, (head, tail) in NEEDLES.items():
        at = data.find(head)
        while at != -1:
            if data[at + len(head) : at + len(head) + len(tail)] == tail:
                found.add(name)
            at = data.find(head, at + 1)
print(sorted(found))
"""


def halves(data: bytes) -> tuple[bytes, bytes]:
    return data[: len(data) // 2], data[len(data) // 2 :]


def test_the_previous_runs_code_inputs_and_fetched_files_are_not_in_the_next_runs_memory(
    one_slot,
):
    code_secret, input_secret = secrets.token_hex(16), secrets.token_hex(16)
    output_secret = code_secret[::-1]  # made by the program: its code must not hold it
    code = f"SECRET = {code_secret!r}\nopen('out.bin', 'w').write(SECRET[::-1] * 20)\n"
    small_input = (input_secret * 20).encode()[:600]
    large_input = (input_secret * 700).encode()  # 22 KB
    needles = {
        "code": code_secret.encode(),
        "code, base64": base64.b64encode(code.encode()),
        "input": input_secret.encode(),
        "input, base64": base64.b64encode(small_input)[:40],
        "large input, base64": base64.b64encode(large_input)[8000:8040],
        "fetched file": output_secret.encode(),
        "fetched file, base64": base64.b64encode((output_secret * 20).encode())[:40],
    }
    attack = run(
        one_slot,
        code,
        files={"small.bin": small_input, "large.bin": large_input},
        fetch_files=["out.bin"],
    )
    assert attack.status == Status.OK, attack.stderr
    scan = MEMORY_SCAN.format(needles={name: halves(data) for name, data in needles.items()})
    result = run(one_slot, scan)
    assert (result.status, result.stdout) == (Status.OK, "[]\n"), result.stderr


# 2. A run cannot change the zygote's limits, priority or scheduling

OWN_ATTRIBUTES = """
import os, resource
limits = [resource.getrlimit(getattr(resource, name)) for name in sorted(dir(resource))
          if name.startswith('RLIMIT_')]
print(limits, os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)),
      os.sched_getscheduler(0))
"""

TAMPERING = """
import ctypes, os, resource
zygote = os.getppid()
libc = ctypes.CDLL(None, use_errno=True)
IOPRIO_WHO_PROCESS, IOPRIO_WHO_USER, IOPRIO_IDLE = 1, 3, 3 << 13

def ioprio_set(which, who):
    if libc.syscall({ioprio_set}, which, who, IOPRIO_IDLE) != 0:
        raise OSError(ctypes.get_errno(), 'ioprio_set')

tampering = {{
    'prlimit NOFILE': lambda: resource.prlimit(zygote, resource.RLIMIT_NOFILE, (200, 200)),
    'prlimit AS': lambda: resource.prlimit(zygote, resource.RLIMIT_AS, (60 << 20, 60 << 20)),
    'prlimit STACK': lambda: resource.prlimit(zygote, resource.RLIMIT_STACK, (1 << 20, 1 << 20)),
    'setpriority': lambda: os.setpriority(os.PRIO_PROCESS, zygote, 19),
    'setpriority, whole uid': lambda: os.setpriority(os.PRIO_USER, 0, 19),
    'sched_setaffinity': lambda: os.sched_setaffinity(zygote, {{0}}),
    'SCHED_IDLE': lambda: os.sched_setscheduler(zygote, os.SCHED_IDLE, os.sched_param(0)),
    'ioprio_set': lambda: ioprio_set(IOPRIO_WHO_PROCESS, zygote),
    'ioprio_set, whole uid': lambda: ioprio_set(IOPRIO_WHO_USER, 0),
}}
for name, tamper in tampering.items():
    try:
        tamper()
        print(name, 'changed the zygote')
    except OSError as error:
        print(name, 'denied:', os.strerror(error.errno))
"""


def test_a_run_cannot_change_the_zygotes_limits_priority_or_scheduling(one_slot):
    before = run(one_slot, OWN_ATTRIBUTES)
    assert before.status == Status.OK, before.stderr
    ioprio_set = seccomp.host_architecture().numbers["ioprio_set"]
    attack = run(one_slot, TAMPERING.format(ioprio_set=ioprio_set))
    lines = attack.stdout.splitlines()
    assert len(lines) == 9 and all("denied: Operation not permitted" in line for line in lines), (
        attack.stdout + attack.stderr
    )
    assert run(one_slot, OWN_ATTRIBUTES).stdout == before.stdout


def test_the_programs_own_limits_priority_and_scheduling_are_still_its_to_change(one_slot):
    code = """
        import os, resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))
        resource.prlimit(0, resource.RLIMIT_STACK, (1 << 20, 1 << 20))
        os.nice(5)
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        print(resource.getrlimit(resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, 0))
    """
    result = run(one_slot, code)
    assert (result.status, result.stdout) == (Status.OK, "(100, 100) 5\n"), result.stderr


def as_uid(uid: int, action) -> None:
    """Call `action` in a child of this process that has taken the uid `uid`."""
    child = os.fork()
    if child == 0:
        exit_code = 1
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            action()
            exit_code = 0
        finally:
            os._exit(exit_code)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0


def test_a_zygote_changed_from_outside_is_replaced_before_the_next_run(one_slot):
    """As a run that got past the seccomp filter would: a process of the slot's uid lowers the
    zygote's limits and priority. The zygote compares them with what it started with before
    each run, and gives up its slot when they differ."""
    before = run(one_slot, OWN_ATTRIBUTES)
    tampered = zygote_pid(one_slot)
    (slot_uid,) = one_slot.stats()["slot_uids"]
    as_uid(slot_uid, lambda: resource.prlimit(tampered, resource.RLIMIT_NOFILE, (200, 200)))
    as_uid(slot_uid, lambda: os.setpriority(os.PRIO_PROCESS, tampered, 19))
    after = run(one_slot, OWN_ATTRIBUTES)
    assert (after.status, after.stdout) == (Status.OK, before.stdout), after.stderr
    assert zygote_pid(one_slot) != tampered


def test_a_program_that_cannot_start_is_a_sandbox_error_and_its_zygote_is_replaced(one_slot):
    first = zygote_pid(one_slot)
    result = run(one_slot, "print('never')", files={"data": b"x", "data/inner": b"y"})
    assert result.status == Status.SANDBOX_ERROR
    assert "cannot start the program" in result.stderr
    assert run(one_slot, "print('next')").stdout == "next\n"
    assert zygote_pid(one_slot) != first


# 3. A run cannot deny the next one its slot

FILL_SCRATCH = """
import os, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then a write past the file size limit fails
for directory in {scratch!r}:
    filling = os.open(os.path.join(directory, 'filling'), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(filling, b'x' * 2**20)
    except OSError:
        pass
created = 0
try:
    while created < {attempts}:
        open(f'/tmp/empty-{{created}}', 'w').close()
        created += 1
except OSError:
    pass
print(created)
"""


def test_a_run_that_fills_every_scratch_directory_does_not_fail_the_next(one_slot):
    cap = one_slot.settings.disk_mb * 256  # files per tmpfs: one per 4 KiB of its size
    attack = run(one_slot, FILL_SCRATCH.format(scratch=SCRATCH, attempts=2 * cap), timeout_s=30)
    assert attack.status == Status.OK, attack.stderr
    assert int(attack.stdout) < cap  # the inode cap of the tmpfs, not the loop's end
    look = "import os; print([sorted(os.listdir(d)) for d in ('.', '/tmp', '/dev/shm')])"
    result = run(one_slot, look, memory_mb=128)  # below what the attack left in the tmpfs
    assert (result.status, result.stdout) == (Status.OK, "[['main.py'], [], []]\n"), result.stderr


HOLD_MEMORY = """
import sys
sys.stdin.readline()  # until it has been moved into the slot's cgroup, where it is charged
held = b'x' * (200 << 20)
print('holding', flush=True)
sys.stdin.readline()
"""


def test_memory_the_slot_cannot_account_for_resets_the_slot_instead_of_failing_the_run(one_slot):
    """The memory limit of a run cannot be set below what the slot's cgroup holds; the slot is
    then swept and started afresh, and the run is served."""
    run(one_slot, "pass", memory_mb=512)  # room for what the holder will hold
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_MEMORY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    # Reaped as soon as the slot's sweep kills it: the sweep waits until the cgroup is empty.
    reaper = threading.Thread(target=holder.wait)
    reaper.start()
    try:
        for directory in slot_cgroup_dirs(one_slot.stats()["slot_uids"]):
            if directory.is_dir():
                (directory / "cgroup.procs").write_text(str(holder.pid))
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "holding\n"
        result = run(one_slot, "print('served')", memory_mb=128)
        assert (result.status, result.stdout) == (Status.OK, "served\n"), result.stderr
        reaper.join(timeout=10)
        assert holder.returncode == -9  # swept with the slot
    finally:
        holder.kill()
        reaper.join()


# 4. Sockets and memory do not outlive their run

LEAVE_A_SOCKET_CYCLE = """
import array, os, socket
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind('\\0{name}')
listener.listen()
left, right = socket.socketpair()
held = []
for _ in range(9):  # 180 MB in memory files
    fd = os.memfd_create('held')
    os.write(fd, b'x' * (20 << 20))
    held.append(fd)
# `right` then holds itself, `left`, the listener and the memory files in its own queue: a cycle
# that no process holds any more once this one exits.
fds = array.array('i', [left.fileno(), right.fileno(), listener.fileno(), *held])
left.sendmsg([b'x'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
print('left')
"""

LOOK_FOR_THE_SOCKET_AND_ALLOCATE = """
print(any('@{name}' in line for line in open('/proc/net/unix')))
data = b'x' * (200 << 20)
print(len(data) >> 20)
"""


def test_a_socket_cycle_holding_memory_files_is_collected_before_the_next_run(one_slot):
    name = f"satseq-left-{secrets.token_hex(4)}"
    attack = run(one_slot, LEAVE_A_SOCKET_CYCLE.format(name=name))
    assert (attack.status, attack.stdout) == (Status.OK, "left\n"), attack.stderr
    result = run(one_slot, LOOK_FOR_THE_SOCKET_AND_ALLOCATE.format(name=name), memory_mb=256)
    assert (result.status, result.stdout) == (Status.OK, "False\n200\n"), result.stderr


# 5. Covert channels through the scratch directories' metadata

MARK_THE_DIRECTORIES = """
import fcntl, os, struct
FS_IOC_SETFLAGS, FS_NODUMP_FL = 0x40086602, 0x40
for directory in {scratch!r}:
    os.setxattr(directory, 'user.satseq', b'left by the last run')
    os.utime(directory, (1234567890, 1234567890))
    fd = os.open(directory, os.O_RDONLY)
    fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack('l', FS_NODUMP_FL))
"""

READ_THE_MARKS = """
import fcntl, os, struct
FS_IOC_GETFLAGS = 0x80086601
for directory in {scratch!r}:
    fd = os.open(directory, os.O_RDONLY)
    (flags,) = struct.unpack('l', fcntl.ioctl(fd, FS_IOC_GETFLAGS, struct.pack('l', 0)))
    print(directory, os.listxattr(directory), os.stat(directory).st_mtime == 1234567890, flags)
"""


def test_xattrs_times_and_flags_of_the_scratch_directories_do_not_reach_the_next_run(one_slot):
    before = run(one_slot, READ_THE_MARKS.format(scratch=SCRATCH))
    assert before.status == Status.OK, before.stderr
    attack = run(one_slot, MARK_THE_DIRECTORIES.format(scratch=SCRATCH))
    assert attack.status == Status.OK, attack.stderr
    assert run(one_slot, READ_THE_MARKS.format(scratch=SCRATCH)).stdout == before.stdout


# 6 and 7. An interpreter under /tmp, or reached through a symlink


@pytest.fixture(scope="module")
def venv_under_tmp(tmp_path_factory):
    """A virtual environment where a checkout under /tmp keeps its `.venv`."""
    venv = tmp_path_factory.mktemp("checkout") / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert str(venv).startswith("/tmp/")
    return venv


SCRATCH_AND_PREFIX = "import os, sys; print(os.listdir('/tmp'), sys.prefix != sys.base_prefix)"


def runs_on_one_zygote(python: str) -> list[str]:
    """The outputs of three runs that each leave a file in /tmp, on one slot of a backend with
    `python`, which must keep its zygote throughout."""
    backend = start_backend(workers=1, python=python)
    try:
        zygote = zygote_pid(backend)
        outputs = [
            run(backend, SCRATCH_AND_PREFIX + "\nopen('/tmp/left', 'w')").stdout for _ in range(3)
        ]
        assert zygote_pid(backend) == zygote
        return outputs
    finally:
        backend.close()


def test_an_interpreter_under_tmp_stays_out_of_the_sandboxs_tmp(venv_under_tmp):
    assert runs_on_one_zygote(str(venv_under_tmp / "bin" / "python")) == ["[] True\n"] * 3


def test_an_interpreter_reached_through_a_symlink_starts_at_full_isolation(venv_under_tmp):
    link = venv_under_tmp.parent / "linked-venv"
    link.symlink_to(venv_under_tmp, target_is_directory=True)
    assert runs_on_one_zygote(str(link / "bin" / "python")) == ["[] True\n"] * 3
