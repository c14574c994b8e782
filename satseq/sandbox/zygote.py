"""The zygote: a warm interpreter inside the sandbox that forks one fresh process per run.

A slot supervisor starts it once, through the whole sandbox stack (its cgroup, its uid,
bubblewrap where available) and with the program's environment, as

    python zygote.py CONTROL_FD

where CONTROL_FD is a SOCK_SEQPACKET socket to the supervisor. The zygote:
1. reads its setup (JSON), makes itself non-dumpable and a child subreaper, installs Landlock
   and the seccomp filter (confine.py), so that every run inherits both, and answers with
   the layers it installed;
2. for each run, receives "run" with five descriptors (spec, stdin, stdout, stderr, status),
   answers "started" and writes the input files into the working directory;
3. forks. The child takes the run's stdio, a session of its own and the run's resource
   limits, and becomes the program: Python code runs in this interpreter as `python main.py`
   would run it (a fresh `__main__`, its own directory first on sys.path); bash is exec'ed;
4. waits for the child to exit, or for "kill" from the supervisor (timeout, output limit),
   then kills every process the run left and reaps them;
5. reads the requested files back, writes the status (JSON: exit code, CPU time, files, an
   error) into the status descriptor, answers "done", and empties the writable directories.

Runs cannot reach each other. Each is a fresh process forked from the same zygote, which
never runs a program itself; whatever a run leaves running is killed before its "done", and
whatever it leaves in the writable directories is deleted before the next run is read. A run
can signal the zygote (same uid), but neither trace it (seccomp) nor read its memory or
descriptors (non-dumpable): a zygote that dies or stops is replaced by the supervisor. It
exits when the supervisor closes the socket, or when it cannot empty a directory.

It imports only the standard library and confine.py, which lies beside it in the sandbox:
satseq itself is not visible there.
"""

import base64
import builtins
import gc
import json
import os
import resource
import select
import shutil
import signal
import socket
import stat
import sys
import types
from importlib.machinery import SourceFileLoader

if __name__ == "__main__":
    import confine  # beside this script, in the sandbox and on the host
else:
    from satseq.sandbox import confine

MESSAGE_BYTES = 1 << 16
RUN_DESCRIPTORS = 5  # spec, stdin, stdout, stderr, status
BASH = "/bin/bash"


def main(control):
    """Steps 1-5 of the module docstring, until the supervisor closes `control`. Returns None
    in the zygote, and in each forked child the run it is to become."""
    setup = json.loads(control.recv(MESSAGE_BYTES))
    confine.prctl(confine.PR_SET_DUMPABLE, 0)
    confine.prctl(confine.PR_SET_CHILD_SUBREAPER, 1)
    try:
        layers = confine.install_layers(setup)
    except OSError as error:
        control.send(json.dumps({"error": f"zygote: {error}"}).encode())
        return None
    os.chdir(setup["workdir"])
    modes = {path: stat.S_IMODE(os.stat(path).st_mode) for path in setup["scratch"]}
    # The collector then leaves the zygote's objects alone in the children: an exiting child
    # copies far fewer pages (copy-on-write), which halves the cost of its interpreter's exit.
    gc.freeze()
    control.send(json.dumps({"layers": layers}).encode())
    while True:
        message, descriptors, _, _ = socket.recv_fds(control, MESSAGE_BYTES, RUN_DESCRIPTORS)
        if not message:
            return None
        if message != b"run":
            continue  # a "kill" that came after its run had ended
        control.send(b"started")
        child = serve(control, descriptors, setup["kill_all"])
        if child is not None:
            return child
        control.send(b"done")
        for path, mode in modes.items():
            try:
                empty_directory(path, mode)
            except OSError as error:
                sys.exit(f"zygote: cannot empty {path} for the next run: {error}")


def serve(control, descriptors, kill_all):
    """Steps 2-5 for one run. Returns None in the zygote, once the status is written, and
    (spec, stdio descriptors) in the child."""
    spec_fd, *stdio, status_fd = descriptors
    with os.fdopen(spec_fd, "rb") as spec_file:
        spec = json.loads(spec_file.read())
    status = {"exit_code": None, "cpu_s": 0.0, "files": {}, "error": None}
    pid = None
    try:
        write_inputs(".", spec["files"])
        pid = os.fork()
    except OSError as error:
        status["error"] = f"zygote: {error}"
    if pid == 0:
        control.close()
        os.close(status_fd)
        return spec, stdio
    for fd in stdio:
        os.close(fd)
    if pid is not None:
        status["exit_code"], status["cpu_s"] = wait_and_sweep(pid, control, kill_all)
        status["files"] = read_outputs(".", spec["fetch_files"], spec["max_fetch_bytes"])
    with os.fdopen(status_fd, "wb") as status_file:
        status_file.write(json.dumps(status).encode())
    return None


def wait_and_sweep(pid, control, kill_all):
    """Wait until the child exits or the supervisor says "kill" (or goes away); then kill
    every process of the run and reap them. Returns the child's exit code, as subprocess
    reports it, and CPU time."""
    pidfd = os.pidfd_open(pid)
    readable, _, _ = select.select([pidfd, control], [], [])
    os.close(pidfd)
    if control in readable:
        control.recv(MESSAGE_BYTES)
    # The child is unreaped until wait4, so its pid, and its process group, are not reused.
    kill_run(pid, kill_all)
    _, wait_status, usage = os.wait4(pid, 0)
    reap(kill_all)
    return os.waitstatus_to_exitcode(wait_status), usage.ru_utime + usage.ru_stime


def kill_run(pid, kill_all):
    """SIGKILL the run: with `kill_all` (the zygote's pid namespace or uid holds only this
    slot), every process but the zygote, in one step that no fork escapes; otherwise the
    child's process group."""
    try:
        if kill_all:
            os.kill(-1, signal.SIGKILL)
        else:
            os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # nothing left to kill


def reap(kill_all):
    """Reap the run's processes, which are all the zygote's children (it is their subreaper):
    all of them when `kill_all` reached them, else those that have ended."""
    flags = 0 if kill_all else os.WNOHANG
    while True:
        try:
            pid, _ = os.waitpid(-1, flags)
        except ChildProcessError:
            return
        if pid == 0:
            return


def write_inputs(cwd, files):
    """Write {relative path: base64 content} under `cwd`, which is empty."""
    for name, content in files.items():
        path = os.path.join(cwd, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        with os.fdopen(fd, "wb") as handle:
            handle.write(base64.b64decode(content))


def read_outputs(cwd, names, max_bytes):
    """{name: base64} for each requested regular file of at most `max_bytes` bytes."""
    fetched = {}
    for name in names:
        try:
            fd = os.open(os.path.join(cwd, name), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)  # a FIFO or a device could block or never end
            continue
        with os.fdopen(fd, "rb") as handle:
            content = handle.read(max_bytes + 1)
        if len(content) <= max_bytes:
            fetched[name] = base64.b64encode(content).decode("ascii")
    return fetched


def empty_directory(path, mode):
    """Delete everything under `path`, whatever the run did to the permissions, and give
    `path` back its `mode`."""
    os.chmod(path, mode)
    for root, directories, _ in os.walk(path):
        for name in directories:
            directory = os.path.join(root, name)
            if not os.path.islink(directory):
                os.chmod(directory, 0o700)
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def become_program(spec, stdio):
    """In the forked child: take the run's stdio, session and limits, then run the code."""
    try:
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        os.setsid()
        confine.prctl(confine.PR_SET_DUMPABLE, 1)  # as after an exec
        for name, (soft, hard) in spec["rlimits"].items():
            resource.setrlimit(getattr(resource, "RLIMIT_" + name), (soft, hard))
        if spec["language"] == "bash":
            os.execv(BASH, [BASH, spec["source"]])
    except BaseException as error:
        os.write(2, f"sandbox: cannot start the program: {error}\n".encode())
        os._exit(127)
    run_python(os.path.abspath(spec["source"]))


def run_python(path):
    """Run the file at `path` as `python path` would: in a fresh `__main__`, with its
    directory first on sys.path. An uncaught exception is printed without this module's
    frame and exits with status 1; SystemExit ends the interpreter as usual."""
    sys.argv = [os.path.basename(path)]
    sys.orig_argv = [sys.orig_argv[0], *sys.argv]
    sys.path[0] = os.path.dirname(path)
    del sys.modules["confine"]  # the program's own confine.py, if any, must be the one found
    main_module = types.ModuleType("__main__")
    main_module.__file__ = path
    main_module.__cached__ = None
    main_module.__loader__ = SourceFileLoader("__main__", path)
    main_module.__builtins__ = builtins
    sys.modules["__main__"] = main_module
    with open(path, "rb") as source:
        text = source.read()
    try:
        exec(compile(text, path, "exec", dont_inherit=True), main_module.__dict__)
    except SystemExit:
        raise
    except BaseException as error:
        error.with_traceback(error.__traceback__.tb_next)
        sys.excepthook(type(error), error, error.__traceback__)
        sys.exit(1)


if __name__ == "__main__":
    run = main(socket.socket(fileno=int(sys.argv[1])))
    if run is not None:  # in a forked child: this process is the run's program now
        become_program(*run)
