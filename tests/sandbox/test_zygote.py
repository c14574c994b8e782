"""The zygote, on a pool of one slot, so that every run here follows the one before it in the
same sandbox: nothing of a run reaches the next, a run still runs as `python main.py` would,
and a zygote that dies, hangs or is killed is replaced."""

import os
import signal
import subprocess
import sys
import time

import pytest

from satseq.sandbox.types import Status
from tests.sandbox.backends import run, zygote_pid

ONLY_OWN_PROCESSES = """
import os
print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, os.getppid(), os.getpid()])
"""


# Nothing of one run reaches the next


def test_files_globals_and_permissions_left_by_a_run_are_gone_for_the_next(one_slot):
    look = """
        import builtins, json, os, sys
        print(sorted(os.listdir('.')), os.listdir('/tmp'), os.listdir('/dev/shm'))
        print(oct(os.stat('.').st_mode), oct(os.stat('/tmp').st_mode))
        print([name for name in ('LEFT', 'ALSO_LEFT') if hasattr(builtins, name)])
        print(hasattr(json, 'LEFT'), '/left' in sys.path, 'LEFT' in os.environ)
        print('left' in sys.modules)
    """
    leave = """
        import builtins, json, os, sys
        for directory in ('.', '/tmp', '/dev/shm'):
            open(os.path.join(directory, 'left'), 'w').write('x')
        os.makedirs('locked/deeper')
        open('locked/deeper/file', 'w').write('x')
        os.chmod('locked/deeper', 0)
        os.chmod('locked', 0)
        os.symlink('/usr', 'link-to-usr')
        os.mkfifo('/tmp/fifo')
        os.chmod('/tmp', 0)
        os.chmod('.', 0o500)
        builtins.LEFT = json.LEFT = 1
        sys.path.append('/left')
        os.environ['LEFT'] = '1'
        sys.modules['left'] = json
        ALSO_LEFT = 1
        builtins.ALSO_LEFT = ALSO_LEFT
    """
    before = run(one_slot, look)
    assert before.status == Status.OK, before.stderr
    assert run(one_slot, leave).status == Status.OK
    assert run(one_slot, look).stdout == before.stdout
    assert before.stdout.startswith("['main.py'] [] []\n")


def test_processes_a_run_leaves_running_are_gone_for_the_next(one_slot):
    leave = """
        import os, subprocess
        subprocess.Popen(['sleep', '60'], start_new_session=True)
        if os.fork() == 0:
            os.setsid()
            os.execv('/bin/sleep', ['sleep', '60'])
    """
    assert run(one_slot, leave).status == Status.OK
    assert run(one_slot, ONLY_OWN_PROCESSES).stdout == "True\n"


def test_ipc_objects_that_would_outlive_a_run_cannot_be_made(one_slot):
    code = """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        IPC_CREAT, O_CREAT_RDWR = 0o1000, 0o100 | 2
        for name, call in (
            ('shmget', lambda: libc.shmget(0x5A7, 4096, IPC_CREAT | 0o600)),
            ('semget', lambda: libc.semget(0x5A7, 1, IPC_CREAT | 0o600)),
            ('msgget', lambda: libc.msgget(0x5A7, IPC_CREAT | 0o600)),
            ('mq_open', lambda: libc.mq_open(b'/satseq', O_CREAT_RDWR, 0o600, None)),
        ):
            print(name, call(), ctypes.get_errno())
    """
    result = run(one_slot, code)
    assert result.stdout == "shmget -1 1\nsemget -1 1\nmsgget -1 1\nmq_open -1 1\n", result.stderr


def test_each_run_has_its_own_random_state(one_slot):
    code = "import random, os; print(random.random(), os.urandom(8).hex())"
    assert len({run(one_slot, code).stdout for _ in range(3)}) == 3


# A run is what `python main.py` would be


def test_the_program_runs_as_main_py_would(one_slot):
    code = """
        import sys, types
        print(__name__, sys.argv, sys.path[0], __file__, type(__builtins__) is types.ModuleType)
        import confine, zygote
        print(confine.OURS, zygote.OURS)
    """
    files = {"confine.py": b"OURS = 'mine'\n", "zygote.py": b"OURS = 'also mine'\n"}
    result = run(one_slot, code, files=files)
    assert result.stdout == (
        "__main__ ['main.py'] /sandbox /sandbox/main.py True\nmine also mine\n"
    ), result.stderr


def test_the_interpreter_ends_as_usual_threads_atexit_and_unclosed_files(one_slot):
    code = """
        import atexit, threading, time
        log = open('log.txt', 'w')
        log.write('written, never closed')
        atexit.register(print, 'atexit ran')
        threading.Thread(target=lambda: (time.sleep(0.2), print('thread ended'))).start()
    """
    result = run(one_slot, code, fetch_files=["log.txt"])
    assert result.stdout == "thread ended\natexit ran\n", result.stderr
    assert result.fetched_files == {"log.txt": b"written, never closed"}


@pytest.mark.parametrize(
    "code",
    ["def f():\n    return 1 / 0\n\nf()\n", "x = (1 +\n", "raise SystemExit('bye')\n"],
    ids=["exception", "syntax-error", "exit-message"],
)
def test_errors_read_exactly_as_bare_python_prints_them(one_slot, code, tmp_path):
    (tmp_path / "main.py").write_text(code)
    bare = subprocess.run(
        [sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    result = run(one_slot, code)
    assert result.return_code == bare.returncode
    assert result.stderr == bare.stderr.replace(str(tmp_path), "/sandbox")


@pytest.mark.parametrize(
    ("code", "request_limits", "status", "return_code"),
    [
        ("print('fine')", {}, Status.OK, 0),
        ("raise SystemExit(3)", {}, Status.ERROR, 3),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", {}, Status.ERROR, -15),
        ("import time; time.sleep(30)", {"timeout_s": 0.5}, Status.TIMEOUT, None),
        ("data = 'x' * 2**31", {"memory_mb": 128}, Status.MEMORY, None),
        ("print('x' * 10**6)", {"max_output_bytes": 1000}, Status.OUTPUT_LIMIT, None),
    ],
    ids=["ok", "exit-code", "signal", "timeout", "memory", "output-limit"],
)
def test_statuses_and_return_codes(one_slot, code, request_limits, status, return_code):
    result = run(one_slot, code, **request_limits)
    assert result.status == status, result.stderr
    if status != Status.MEMORY:  # killed by the OOM killer or exited on MemoryError
        assert result.return_code == return_code
    assert run(one_slot, "print('next')").stdout == "next\n"


# Limits


def test_a_timeout_kills_the_run_and_everything_it_started(one_slot):
    code = """
        import subprocess, time
        subprocess.Popen(['sleep', '60'], start_new_session=True)
        time.sleep(60)
    """
    started = time.monotonic()
    result = run(one_slot, code, timeout_s=1.0)
    assert result.status == Status.TIMEOUT
    assert time.monotonic() - started < 1.5
    assert run(one_slot, ONLY_OWN_PROCESSES).stdout == "True\n"


def test_the_output_cap_covers_what_the_runs_subprocesses_write(one_slot):
    code = """
        import subprocess, sys
        subprocess.run([sys.executable, '-c', 'import sys; sys.stderr.write("e" * 100_000)'])
    """
    result = run(one_slot, code, max_output_bytes=1000)
    assert result.status == Status.OUTPUT_LIMIT and result.truncated
    assert result.stderr == "e" * 1000


def test_the_programs_resource_limits_are_the_runs(one_slot):
    code = "echo $(ulimit -n) $(ulimit -c) $(ulimit -t)"
    result = run(one_slot, code, language="bash", timeout_s=3.0)
    assert result.stdout == f"{one_slot.settings.max_open_files} 0 4\n", result.stderr


# A zygote that is gone is replaced


def test_a_zygote_killed_between_runs_is_replaced_and_the_next_run_is_served(one_slot):
    killed = zygote_pid(one_slot)
    os.kill(killed, signal.SIGKILL)
    result = run(one_slot, "print('still here')")
    assert (result.status, result.stdout) == (Status.OK, "still here\n")
    assert zygote_pid(one_slot) != killed
    assert one_slot.stats()["restarts"] == 0  # the supervisor itself lived on


def test_a_run_that_kills_its_zygote_fails_alone(one_slot):
    result = run(one_slot, "import os, signal; os.kill(os.getppid(), signal.SIGKILL)")
    assert result.status == Status.SANDBOX_ERROR
    assert "no report from the zygote" in result.stderr
    assert run(one_slot, "print('next')").stdout == "next\n"


def test_a_run_that_stops_its_zygote_times_out_and_the_zygote_is_replaced(one_slot):
    stopped = zygote_pid(one_slot)
    started = time.monotonic()
    result = run(one_slot, "import os, signal; os.kill(os.getppid(), signal.SIGSTOP)", timeout_s=1)
    assert result.status == Status.TIMEOUT
    assert time.monotonic() - started < 1 + 5 + 1  # the timeout, then the wait for "done"
    assert run(one_slot, "print('next')").stdout == "next\n"
    assert zygote_pid(one_slot) != stopped
