"""The zygote: a warm interpreter inside the sandbox that forks one fresh process per run.

A slot supervisor starts it once, through the whole sandbox stack (its cgroup, its uid,
bubblewrap where available) and with the program's environment, as

    python -P zygote.py CONTROL_FD

where CONTROL_FD is a SOCK_SEQPACKET socket to the supervisor. (-P: its own directory is not on
sys.path, where without bubblewrap the rest of satseq/sandbox would shadow the standard
library: types.py.) The zygote:
1. reads its setup (JSON), makes itself non-dumpable and a child subreaper, installs Landlock
   and the seccomp filter (confine.py), so that every run inherits both, notes its own
   attributes (`own_attributes`) and the scratch directories' metadata, and answers with the
   layers it installed;
2. for each run, receives "run" with five descriptors (spec, stdin, stdout, stderr, status),
   checks that its attributes are still the ones it noted (else it exits, and the supervisor
   starts a new one), answers "started" and forks;
3. the child reads the spec, writes the input files into the working directory, takes the
   run's stdio, a session of its own and every resource limit, and becomes the program:
   Python code runs in this interpreter as `python main.py` would run it (a fresh `__main__`,
   its own directory first on sys.path); bash is exec'ed. If it cannot, it writes why into
   the status descriptor, and the supervisor replaces the zygote;
4. the zygote waits for the child to exit, or for "kill" from the supervisor (timeout, output
   limit), then kills every process the run left and reaps them;
5. forks a clean-up process, which reads the requested files back, writes the status (JSON:
   exit code, CPU time, files, an error) into the status descriptor, and resets the scratch
   directories (scratch.py); then answers "done".

Runs cannot reach each other. Each is a fresh process forked from the same zygote, which
never runs a program itself and never holds a run's data: the spec, the input and output
files and the names a run leaves in the scratch directories are read only by the processes
forked for that run, which exit, so the next run, a copy of the zygote's memory, cannot find
them there (the zygote itself reaps the run's first process, and so learns its exit code and
CPU time). Whatever a run leaves running is killed, and whatever it leaves in the scratch
directories deleted, before its "done". A run can signal the zygote (same uid), but neither
trace it (seccomp) nor read its memory or descriptors (non-dumpable), nor change its limits,
priority or scheduling (seccomp): a zygote that dies or stops is replaced by the supervisor.
It exits when the supervisor closes the socket, or when it cannot reset the scratch
directories.

Two counters stay shared, accepted as covert channels between two runs that both take part
(neither carries anything of a run that does not): the sandbox's pid counter, which a run that
forks k times moves the next run's pid by (about 12 bits per pair of runs at the default 5 s
limit and ~1,000 forks/s on 2 cores; at most log2 of pid_max), and the zygote's /proc/2/stat,
whose children's CPU time grows by each run's (10 ms ticks: about 9 bits at 5 s, less the
noise). A pid namespace per run is out of reach: bubblewrap drops every capability and
--disable-userns forbids the user namespace an unprivileged pid namespace needs; /proc would
show the sandbox's own pid namespace all the same.

It imports only the standard library and the modules beside it in the sandbox (confine.py,
scratch.py): satseq itself is not visible there.
"""

import base64
import builtins
import gc
import json
import os
import resource
import select
import signal
import socket
import stat
import sys
import types
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_file_location


def load_beside(name):
    """The module `name`.py from this script's directory, left out of sys.modules: a
    program's own module of that name must be the one it imports."""
    spec = spec_from_file_location(name, os.path.join(os.path.dirname(__file__), f"{name}.py"))
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    confine, scratch = load_beside("confine"), load_beside("scratch")
else:
    from satseq.sandbox import confine, scratch

MESSAGE_BYTES = 1 << 16
RUN_DESCRIPTORS = 5  # spec, stdin, stdout, stderr, status
BASH = "/bin/bash"


def limit_names():
    """One RLIMIT_ name per resource: RLIMIT_OFILE is another name of RLIMIT_NOFILE."""
    names = {}
    for name in sorted(dir(resource)):
        if name.startswith("RLIMIT_"):
            names.setdefault(getattr(resource, name), name)
    return tuple(names.values())


RLIMITS = limit_names()


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
    scratch_metadata = {path: scratch.metadata(path) for path in setup["scratch"]}
    attributes = own_attributes()
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
        if own_attributes() != attributes:
            sys.exit("zygote: my limits, priority or scheduling changed; a new zygote must serve")
        control.send(b"started")
        run = serve(control, descriptors, setup["kill_all"], scratch_metadata, attributes["limits"])
        if run is not None:
            return run
        control.send(b"done")


def own_attributes():
    """What the next run would inherit from the zygote and a run might change from outside (the
    seccomp filter stops it): every resource limit, the nice value, the CPU affinity and the
    scheduling policy."""
    return {
        "limits": {name: resource.getrlimit(getattr(resource, name)) for name in RLIMITS},
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "affinity": os.sched_getaffinity(0),
        "policy": (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority),
    }


def serve(control, descriptors, kill_all, scratch_metadata, limits):
    """Steps 3-5 for one run. Returns None in the zygote, once the run is reported and the
    scratch directories are reset, and in the forked child what `become_program` takes."""
    spec_fd, *stdio, status_fd = descriptors
    pid = os.fork()
    if pid == 0:
        control.close()
        return spec_fd, stdio, status_fd, limits
    for fd in stdio:
        os.close(fd)
    exit_code, cpu_s = wait_and_sweep(pid, control, kill_all)
    clean_up({"exit_code": exit_code, "cpu_s": cpu_s}, spec_fd, status_fd, scratch_metadata)
    os.close(spec_fd)
    os.close(status_fd)
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


def clean_up(outcome, spec_fd, status_fd, scratch_metadata):
    """Step 5 in a process of its own, which exits, so that what it reads stays out of the
    zygote's memory: the status (`outcome`: exit code and CPU time), then the scratch
    directories reset. Exits the zygote if that process failed."""
    pid = os.fork()
    if pid == 0:
        try:
            write_status(outcome, spec_fd, status_fd)
            for path, original in scratch_metadata.items():
                scratch.reset(path, original)
        except BaseException as error:
            os.write(2, f"zygote: cannot clean up after the run: {error!r}\n".encode())
            os._exit(1)
        os._exit(0)
    _, wait_status = os.waitpid(pid, 0)
    if wait_status != 0:
        sys.exit(1)  # the clean-up process said why


def write_status(outcome, spec_fd, status_fd):
    """The run's status into `status_fd`: `outcome`, the files the spec asks for, and as the
    error what the child left there if the program could not start."""
    spec = json.loads(os.pread(spec_fd, os.fstat(spec_fd).st_size, 0))
    start_error = os.pread(status_fd, os.fstat(status_fd).st_size, 0).decode(errors="replace")
    status = {
        **outcome,
        "files": read_outputs(".", spec["fetch_files"], spec["max_fetch_bytes"]),
        "error": start_error or None,
    }
    os.ftruncate(status_fd, 0)
    os.pwrite(status_fd, json.dumps(status).encode(), 0)


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


def become_program(spec_fd, stdio, status_fd, limits):
    """In the forked child (step 3): read the spec, write the input files, take the run's
    stdio, session and limits (the spec's, and the zygote's own `limits` as it started for the
    others), then run the code. What fails before the program runs is written into the status
    descriptor, which the program never has."""
    try:
        open_max = resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # above every descriptor
        with os.fdopen(spec_fd, "rb") as spec_file:
            spec = json.loads(spec_file.read())
        write_inputs(".", spec["files"])
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        os.set_inheritable(status_fd, False)  # an exec that succeeds closes it
        os.closerange(3, status_fd)
        os.closerange(status_fd + 1, open_max)
        os.setsid()
        confine.prctl(confine.PR_SET_DUMPABLE, 1)  # as after an exec
        set_limits({**limits, **{"RLIMIT_" + name: v for name, v in spec["rlimits"].items()}})
        if spec["language"] == "bash":
            os.execv(BASH, [BASH, spec["source"]])
    except BaseException as error:
        os.write(status_fd, f"cannot start the program: {error}".encode())
        os._exit(127)
    os.close(status_fd)
    run_python(os.path.abspath(spec["source"]))


def set_limits(limits):
    """Set each resource limit of {RLIMIT_ name: (soft, hard)}."""
    for name, (soft, hard) in limits.items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (OSError, ValueError) as error:
            raise OSError(f"{name} = {(soft, hard)}: {error}") from None


def run_python(path):
    """Run the file at `path` as `python path` would: in a fresh `__main__`, with its
    directory first on sys.path. An uncaught exception is printed without this module's
    frame and exits with status 1; SystemExit ends the interpreter as usual."""
    sys.argv = [os.path.basename(path)]
    sys.orig_argv = [sys.orig_argv[0], *sys.argv]
    sys.path.insert(0, os.path.dirname(path))
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
