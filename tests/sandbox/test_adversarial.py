"""Hostile programs, at the default isolation level: each one is contained, and afterwards
every slot of the pool still serves.

Signal tests use signal 0 (a permission probe) only: nothing here sends a real signal to a
process outside the sandbox, or to -1.
"""

import os
import pwd
import secrets
import socket
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from satseq.sandbox.types import ExecutionRequest, Status
from tests.sandbox.backends import run

# The bound for a timeout: killed and reported within the timeout plus this.
TIMEOUT_SLACK_S = 0.5


@pytest.fixture(autouse=True)
def pool_still_serves(sandbox):
    """After each attack, every slot must still run a program correctly."""
    yield
    with ThreadPoolExecutor(sandbox.settings.workers) as threads:
        requests = [ExecutionRequest(code=f"print({n} * 2)") for n in range(8)]
        results = list(threads.map(sandbox.run, requests))
    assert [r.stdout for r in results] == [f"{n * 2}\n" for n in range(8)]


def attempts(*snippets: str) -> str:
    """A program that runs each snippet and prints "ESCAPED: <snippet>" if it did not raise."""
    lines = ["import ctypes, os, socket", "libc = ctypes.CDLL(None, use_errno=True)"]
    for snippet in snippets:
        lines += [
            "try:",
            f"    result = {snippet}",
            f"    print('ESCAPED:', {snippet!r}, result)",
            "except Exception as error:",
            f"    print('contained:', {snippet!r}, type(error).__name__, error)",
        ]
    return "\n".join(lines)


def assert_contained(result, count: int) -> None:
    assert result.status == Status.OK, result.stderr
    assert "ESCAPED" not in result.stdout, result.stdout
    assert result.stdout.count("contained:") == count, result.stdout


# Network


def test_no_tcp_connection_reaches_a_listener_on_the_hosts_loopback(sandbox):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        code = attempts(f"socket.create_connection(('127.0.0.1', {port}), timeout=2)")
        assert_contained(run(sandbox, code), 1)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_no_dns_lookup(sandbox):
    code = attempts(
        "socket.getaddrinfo('example.com', 80)",
        "socket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
        "socket.socket(socket.AF_INET6, socket.SOCK_STREAM)",
        "socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)",
        "socket.socket(socket.AF_PACKET, socket.SOCK_RAW)",
    )
    assert_contained(run(sandbox, code), 5)


# Host files and secrets


@pytest.fixture
def root_only_file(host_secret):
    """A 0600 root file in a directory the sandbox can see (the interpreter's site-packages);
    removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("a root-only file needs root to create")
    path = Path(sysconfig.get_path("purelib")) / f"satseq-root-only-{secrets.token_hex(4)}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(host_secret)
    yield path
    path.unlink()


def test_root_only_files_cannot_be_read(sandbox, root_only_file):
    code = attempts(
        f"open({str(root_only_file)!r}).read()",
        "open('/etc/shadow').read()",
        "os.listdir('/root/.ssh')",
    )
    assert_contained(run(sandbox, code), 3)


def test_another_slots_working_directory_cannot_be_found(sandbox):
    marker = f"satseq-slot-secret-{secrets.token_hex(4)}"
    writer = f"""
        import time
        open({marker!r}, 'w').write('secret')
        time.sleep(2)
    """
    search = f"""
        import glob, os
        patterns = ['/*/{marker}', '/*/*/{marker}', '/proc/*/cwd/{marker}',
                    '/proc/*/root/sandbox/{marker}', '/tmp/satseq-sandbox/*/{marker}']
        found = [path for pattern in patterns for path in glob.glob(pattern)]
        print('found', found)
    """
    with ThreadPoolExecutor(2) as threads:
        writing = threads.submit(run, sandbox, writer)
        time.sleep(0.5)
        searched = threads.submit(run, sandbox, search).result()
        assert writing.result().status == Status.OK
    assert searched.stdout == "found []\n", searched.stdout


def test_writes_outside_the_working_directory_never_reach_the_host(sandbox):
    marker = f"satseq-write-{secrets.token_hex(4)}"
    code = attempts(
        f"open('/{marker}', 'w')",
        f"open('/usr/{marker}', 'w')",
        f"open('/etc/{marker}', 'w')",
        f"os.mkdir('/var/{marker}')",
    )
    code += f"\nopen('/tmp/{marker}', 'w').write('x')\nopen('/dev/shm/{marker}', 'w').write('x')"
    assert_contained(run(sandbox, code), 4)
    for directory in ("/", "/usr", "/etc", "/var", "/tmp", "/dev/shm"):
        assert not Path(directory, marker).exists(), directory


def test_the_parents_environment_is_not_visible(sandbox, host_secret):
    code = f"""
        import glob, os
        print('env', {host_secret!r} in repr(dict(os.environ)))
        leaked = []
        for path in glob.glob('/proc/*/environ'):
            try:
                if {host_secret!r}.encode() in open(path, 'rb').read():
                    leaked.append(path)
            except OSError:
                pass
        print('leaked', leaked)
    """
    assert host_secret in os.environ.values()
    result = run(sandbox, code)
    assert result.stdout == "env False\nleaked []\n", result.stdout


# Signals and isolation escapes


def test_host_processes_cannot_be_signalled(sandbox):
    host_pids = [os.getpid(), *sandbox.stats()["supervisor_pids"]]
    code = attempts(*(f"os.kill({pid}, 0)" for pid in host_pids))
    assert_contained(run(sandbox, code), len(host_pids))


def test_kill_minus_one_reaches_only_the_sandboxs_own_processes(sandbox):
    code = """
        import os
        os.kill(-1, 0)  # succeeds: the zygote shares the sandbox
        visible = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
        print(visible == [1, os.getppid(), os.getpid()])
    """
    result = run(sandbox, code)
    assert result.status == Status.OK, result.stderr
    assert result.stdout == "True\n"  # bubblewrap's init, the zygote, the program


def test_namespaces_ptrace_and_mount_are_denied(sandbox):
    code = """
        import ctypes, os, shutil, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        calls = {
            "unshare(CLONE_NEWUSER)": lambda: libc.unshare(0x10000000),
            "unshare(CLONE_NEWNS)": lambda: libc.unshare(0x00020000),
            "ptrace(PTRACE_ATTACH, parent)": lambda: libc.ptrace(16, os.getppid(), 0, 0),
            "ptrace(PTRACE_TRACEME)": lambda: libc.ptrace(0, 0, 0, 0),
            "mount(tmpfs, /tmp)": lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None),
        }
        for name, call in calls.items():
            print(name, call(), os.strerror(ctypes.get_errno()))
        if shutil.which("unshare"):
            print("unshare -U:", subprocess.run(["unshare", "-U", "true"]).returncode)
        else:
            print("unshare -U: no such command")
    """
    result = run(sandbox, code)
    lines = result.stdout.splitlines()
    assert len(lines) == 6, result.stdout + result.stderr
    for line in lines[:-1]:
        assert line.endswith(" -1 Operation not permitted"), line
    assert lines[-1] != "unshare -U: 0"


# Resource exhaustion


def test_a_fork_bomb_is_bounded_and_cleaned_up(sandbox):
    code = """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """
    started = time.monotonic()
    result = run(sandbox, code, timeout_s=2.0)
    assert result.status == Status.TIMEOUT
    assert time.monotonic() - started < 2.0 + TIMEOUT_SLACK_S + 1.0


def test_a_thread_bomb_is_bounded(sandbox):
    code = """
        import threading, time
        count = 0
        try:
            while True:
                threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
                count += 1
        except RuntimeError:
            print(count)
    """
    result = run(sandbox, code, timeout_s=5.0)
    assert result.status == Status.OK, result.stderr
    assert 0 < int(result.stdout) < sandbox.settings.max_processes


def test_a_two_gigabyte_memory_bomb_is_a_memory_error(sandbox):
    result = run(sandbox, "data = 'x' * (2 * 1024**3)\nprint(len(data))", memory_mb=256)
    assert result.status == Status.MEMORY
    assert result.stdout == ""


@pytest.mark.parametrize(
    "code",
    [
        "while True:\n    pass",
        "import time\ntime.sleep(100)",
        "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass",
    ],
    ids=["busy-loop", "sleep", "ignored-SIGXCPU"],
)
def test_a_program_that_never_ends_times_out_promptly(sandbox, code):
    started = time.monotonic()
    result = run(sandbox, code, timeout_s=1.0)
    elapsed = time.monotonic() - started
    assert result.status == Status.TIMEOUT
    assert elapsed < 1.0 + TIMEOUT_SLACK_S, elapsed


def test_a_daemon_does_not_survive_its_run(sandbox):
    marker = f"satseq-daemon-{secrets.token_hex(4)}"
    code = f"""
        import os, sys
        if os.fork():
            sys.exit(0)
        os.setsid()
        if os.fork():
            os._exit(0)
        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])
    """
    result = run(sandbox, code)
    assert result.status == Status.OK, result.stderr
    time.sleep(0.2)
    survivors = []
    for entry in Path("/proc").iterdir():
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                survivors.append(entry.name)
        except OSError:
            pass
    assert survivors == []


def test_fifty_megabytes_of_stdout_stop_promptly_at_the_output_limit(sandbox):
    started = time.monotonic()
    result = run(sandbox, "import sys\nsys.stdout.write('x' * 50_000_000)", timeout_s=10.0)
    assert result.status == Status.OUTPUT_LIMIT and result.truncated
    assert len(result.stdout) == sandbox.settings.max_output_bytes
    assert time.monotonic() - started < 3.0


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("open('big', 'wb').write(b'x' * 100_000_000)", "No space left on device"),
        ("f = open('/tmp/fill', 'wb')\nwhile True:\n    f.write(b'x' * 2**20)", "Errno"),
        ("files = [open(f'f{i}', 'w') for i in range(1000)]", "Too many open files"),
    ],
    ids=["100MB-file", "fill-tmp", "1000-open-files"],
)
def test_disk_and_file_descriptor_exhaustion_fail_inside_the_sandbox(sandbox, code, error):
    result = run(sandbox, code, timeout_s=10.0)
    assert result.status == Status.ERROR, result.stderr
    assert error in result.stderr


def test_slot_uids_are_unprivileged_and_unused_by_real_accounts(sandbox):
    for uid in sandbox.stats()["slot_uids"]:
        assert uid >= sandbox.settings.uid_base
        with pytest.raises(KeyError):
            pwd.getpwuid(uid)


def test_concurrent_attacks_do_not_disturb_an_ordinary_run(sandbox):
    bombs = ["import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"] * 2
    with ThreadPoolExecutor(3) as threads:
        attacks = [threads.submit(run, sandbox, bomb, timeout_s=2.0) for bomb in bombs]
        time.sleep(0.3)
        ordinary = threads.submit(run, sandbox, "print(sum(range(10)))").result()
        assert ordinary.stdout == "45\n"
        assert all(attack.result().status == Status.TIMEOUT for attack in attacks)
