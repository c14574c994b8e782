"""The local backend: a pool of isolated slots on this machine (design §6).

Each slot is a supervisor process (supervisor.py) with its own uid, cgroup and working
directory, which keeps a zygote (zygote.py) in the slot's sandbox that forks each run. The
backend starts them, checks that together they reach the configured minimum isolation level
(and refuses to start otherwise), hands each request to an idle slot, and restarts a slot
whose supervisor died or stopped answering.

    with LocalBackend(LocalSandboxSettings(workers=8)) as sandbox:
        result = sandbox.run(ExecutionRequest(code="print(1 + 1)"))
        assert result.stdout == "2\\n"

`run` blocks its thread; `execute` is the same for asyncio callers, from any event loop.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from satseq.sandbox import protocol
from satseq.sandbox.isolation import (
    IsolationReport,
    Layer,
    SandboxUnavailable,
    combine,
    require,
)
from satseq.sandbox.types import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    ExecutionRequest,
    ExecutionResult,
    IsolationLevel,
    sandbox_error,
)

logger = logging.getLogger(__name__)

REPLY_GRACE_S = 30.0
"""How long past a run's own timeout a supervisor may take to answer (start-up, sweeps, a
loaded machine) before the backend gives up on it and restarts the slot."""


@dataclass(frozen=True)
class LocalSandboxSettings:
    """The local backend's knobs; the limits are each request's defaults."""

    workers: int = 4
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    min_isolation: IsolationLevel = IsolationLevel.FULL
    max_processes: int = 64  # tasks (processes + threads) per run, the sandbox's own included
    max_open_files: int = 256
    disk_mb: int = 64  # each writable tmpfs, and the largest file a run may write
    cpus: float = 1.0  # CPU quota per slot, in cores
    uid_base: int = 61000  # slot uids are claimed from here (root only)
    python: str = field(default_factory=lambda: sys.executable)
    bubblewrap: bool = True  # False: never use it, even if installed (e.g. to test without)
    start_timeout_s: float = 120.0


def resolved_interpreter(python: str) -> str:
    """`python` with every symlink in its directories resolved: the sandbox binds resolved
    directories, so a `.venv` that links to a venv elsewhere must be started there. The file
    itself stays as named: a venv's `bin/python` link is what makes it a venv."""
    path = Path(python).absolute()
    return str(path.parent.resolve() / path.name)


def interpreter_paths(python: str) -> list[str]:
    """The directories the sandbox must see for `python` to start: its prefixes (a venv and
    the installation it was made from)."""
    script = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix]))"
    try:
        output = subprocess.run(
            [python, "-I", "-c", script],  # not -S: site.py is what sets a venv's prefix
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise SandboxUnavailable(
            f"the sandbox interpreter {python} does not run: {error}"
        ) from None
    return sorted({str(Path(path).resolve()) for path in json.loads(output)})


class Slot:
    """The backend's handle on one supervisor process; used by one thread at a time."""

    def __init__(self, index: int, settings: dict[str, Any], minimum: IsolationLevel) -> None:
        """`settings` is the supervisor's first frame; `minimum` is checked on restarts."""
        self.index = index
        self._settings = settings
        self._minimum = minimum
        self._process: subprocess.Popen | None = None
        self.report: IsolationReport | None = None
        self.pid: int | None = None
        self.uid: int | None = None
        self.restarts = 0

    def start(self, timeout_s: float) -> IsolationReport:
        """Start the supervisor and wait for its probe report."""
        reply = self._launch(timeout_s)
        if "error" in reply:
            self._discard()
            raise SandboxUnavailable(f"sandbox slot {self.index} failed to start: {reply['error']}")
        self.uid = reply["uid"]
        self.report = IsolationReport(
            active={Layer(k): v for k, v in reply["active"].items()},
            missing={Layer(k): v for k, v in reply["missing"].items()},
        )
        return self.report

    def _launch(self, timeout_s: float) -> dict[str, Any]:
        """Spawn a supervisor, send it the settings, and return its first reply."""
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            # The supervisor must import this satseq, wherever it was found.
            "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),
        }
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from satseq.sandbox.supervisor import main; main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd="/",
            start_new_session=True,  # a Ctrl-C for the backend must not hit a run mid-way
        )
        self.pid = self._process.pid
        # After a restart, the old uid first: the new supervisor then cleans up after the old.
        preferred_uid = self.uid or self._settings["uid_base"] + self.index
        settings = {**self._settings, "preferred_uid": preferred_uid}
        protocol.write_frame(self._process.stdin.fileno(), settings)
        return self._receive(time.monotonic() + timeout_s)

    def _receive(self, deadline: float) -> dict[str, Any]:
        reply = protocol.read_frame(self._process.stdout.fileno(), deadline)
        if reply is None:
            raise ConnectionError(f"sandbox supervisor {self.pid} exited")
        return reply

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """Send a job and wait for its result, on a fresh supervisor if this one is gone.

        A supervisor that exits during a job (it was killed, or crashed) is replaced and the
        job sent once more: runs have no effects outside the slot, so a repeat is harmless.

        Raises:
            OSError, TimeoutError, ValueError: the supervisor died twice, or hung, or sent
                garbage; it has been killed, and the next call starts a new one.
        """
        try:
            return self._send(job)
        except ConnectionError:  # EOF or a broken pipe: it exited
            self._process.wait()
            return self._send(job)

    def _send(self, job: dict[str, Any]) -> dict[str, Any]:
        if self._process is None or self._process.poll() is not None:
            self._restart()
        try:
            protocol.write_frame(self._process.stdin.fileno(), job)
            return self._receive(time.monotonic() + job["timeout_s"] + REPLY_GRACE_S)
        except ConnectionError:
            raise  # it exited by itself: nothing to kill, and `run` may try again
        except (OSError, TimeoutError, ValueError):
            self._process.kill()
            self._process.wait()
            raise

    def _restart(self) -> None:
        """Replace a dead supervisor; fail closed if the new one is below the minimum level."""
        self.restarts += 1
        logger.warning("restarting sandbox slot %d (supervisor %s is gone)", self.index, self.pid)
        # Twice at most: the first successor may probe while its predecessor's processes are
        # still exiting on the same uid and cgroup (seen once in a loaded test run).
        for attempt in range(2):
            self.start(REPLY_GRACE_S)
            try:
                require(self.report, self._minimum)
                return
            except SandboxUnavailable:
                self._discard()
                if attempt == 1:
                    raise
                logger.warning("sandbox slot %d probed below the minimum; once more", self.index)

    def stop(self) -> None:
        """Close the supervisor's stdin; it kills what is left of the slot and exits.

        A supervisor that did not exit cleanly (killed, crashed) cannot have cleaned up: a new
        one is started on its uid, which sweeps the uid and empties the cgroup, and stopped."""
        if self._process is None:
            return
        self._discard()
        if self._process.returncode != 0 and self.uid is not None:
            try:
                self._launch(REPLY_GRACE_S)
            except (OSError, TimeoutError, ValueError) as error:
                logger.warning("could not clean up sandbox slot %d: %s", self.index, error)
            self._discard()

    def _discard(self, timeout_s: float = 30.0) -> None:
        """Close the pipes and wait for the supervisor to finish cleaning up; kill it if it
        takes longer than `timeout_s`."""
        self._process.stdin.close()
        try:
            self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stdout.close()


class LocalBackend:
    """The local sandbox pool; see the module docstring."""

    name = "local"

    def __init__(self, settings: LocalSandboxSettings | None = None) -> None:
        self.settings = settings or LocalSandboxSettings()
        python = resolved_interpreter(self.settings.python)
        slot_settings = {
            **{k: v for k, v in asdict(self.settings).items() if k != "min_isolation"},
            "python": python,
            "readable": interpreter_paths(python),
            "probe_timeout_s": 30.0,
        }
        self._slots = [
            Slot(index, slot_settings, self.settings.min_isolation)
            for index in range(self.settings.workers)
        ]
        self._idle: queue.SimpleQueue[Slot] = queue.SimpleQueue()
        self._executor = ThreadPoolExecutor(self.settings.workers, "satseq-sandbox")
        failures: list[str] = []
        starters = [
            threading.Thread(target=self._start_slot, args=(slot, failures), daemon=True)
            for slot in self._slots
        ]
        for starter in starters:
            starter.start()
        for starter in starters:
            starter.join()
        try:
            if failures:
                raise SandboxUnavailable("; ".join(failures))
            self.isolation = combine([slot.report for slot in self._slots])
            logger.info(self.isolation.describe())
            require(self.isolation, self.settings.min_isolation)
        except SandboxUnavailable:
            self.close()
            raise
        for slot in self._slots:
            self._idle.put(slot)

    def _start_slot(self, slot: Slot, failures: list[str]) -> None:
        try:
            slot.start(self.settings.start_timeout_s)
        except (OSError, TimeoutError, ValueError, SandboxUnavailable) as error:
            failures.append(f"slot {slot.index}: {error}")

    @property
    def level(self) -> IsolationLevel:
        return self.isolation.level

    def _job(self, request: ExecutionRequest) -> dict[str, Any]:
        def encode(content: bytes) -> str:
            return base64.b64encode(content).decode()

        return {
            "language": request.language,
            "code": request.code,
            "stdin": encode(request.stdin.encode()),
            "files": {name: encode(content) for name, content in request.files.items()},
            "fetch_files": request.fetch_files,
            "timeout_s": request.timeout_s or self.settings.timeout_s,
            "memory_mb": request.memory_mb or self.settings.memory_mb,
            "max_output_bytes": request.max_output_bytes or self.settings.max_output_bytes,
        }

    def run(self, request: ExecutionRequest) -> ExecutionResult:
        """Run `request` in the next idle slot; blocks until a slot is free and the run ends."""
        job = self._job(request)
        slot = self._idle.get()
        try:
            reply = slot.run(job)
        except (OSError, TimeoutError, ValueError, SandboxUnavailable) as error:
            logger.warning("sandbox slot %d failed, restarting it: %s", slot.index, error)
            return sandbox_error(f"sandbox: slot {slot.index} failed: {error}", "local")
        finally:
            self._idle.put(slot)
        files = reply.pop("fetched_files", {})
        return ExecutionResult(
            **reply,
            fetched_files={name: base64.b64decode(content) for name, content in files.items()},
            backend="local",
            isolation=self.level,
        )

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """`run` for asyncio code: runs in the backend's own threads, one per slot."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.run, request)

    def stats(self) -> dict[str, Any]:
        """The isolation level, slot uids, supervisor pids and slot restarts."""
        return {
            "name": self.name,
            "isolation": str(self.level),
            "slot_uids": [slot.uid for slot in self._slots],
            "supervisor_pids": [slot.pid for slot in self._slots],
            "restarts": sum(slot.restarts for slot in self._slots),
        }

    def close(self) -> None:
        """Stop every supervisor (after the last run); each one kills its slot's processes and
        removes its cgroup."""
        self._executor.shutdown(wait=True)
        for slot in self._slots:
            slot.stop()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
