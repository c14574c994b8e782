"""Run a function call in a helper process that is killed when the call overruns its deadline.

Why a process: math-verify's own timeout is `signal.alarm`, which Python only allows in the main
thread, and our scorers run in Ray actor threads and thread pools. A Python thread cannot be
stopped from outside: an exception injected into it (`PyThreadState_SetAsyncExc`) waits for the
next bytecode, so a long C call delays it, and it can fire inside a library's cache update. A
process can always be killed, and whatever memory the runaway call took goes with it.

How: each helper is a plain `python -c` child (not `multiprocessing`, whose spawn re-imports the
parent's `__main__`, which in a Ray worker is Ray's own). Calls and replies are pickled over a
socket pair, one call at a time. On a deadline the parent SIGKILLs the helper and starts a
replacement at once, so the next call rarely waits for its imports. If the parent dies, an idle
helper sees end-of-file and exits, and a busy one is stopped by the CPU-time limit it sets itself
before each call.

The cost is one round trip per call (two pickles and two socket hops); `bench/bench_rewards.py`
measures it against calling math-verify in-process.
"""

from __future__ import annotations

import math
import os
import pickle
import resource
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from satseq.rewards.errors import (
    HelperProcessError,
    HelperStartError,
    RewardError,
    ScoringTimeout,
)

STARTUP_TIMEOUT_S = 120.0
"""How long a new helper may take to import and warm up; on a loaded machine sympy is slow."""


def _is_alive() -> bool:
    """The default warm-up call: proves that the helper started and answers."""
    return True


class HelperProcess:
    """One child process that runs pickled calls; not thread-safe, owned by one caller at a time.

    Starting does not block: the warm-up call is sent at once and its reply is awaited on the
    first `call`, outside that call's deadline.
    """

    def __init__(self, warmup: Callable[[], Any]) -> None:
        parent_end, child_end = socket.socketpair()
        # The child must import the same modules as the parent: satseq itself and any custom
        # reward function's package, which may sit on a sys.path entry added at runtime.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))
        command = f"from {__name__} import serve; serve({child_end.fileno()})"
        self._process = subprocess.Popen(
            [sys.executable, "-c", command],
            pass_fds=(child_end.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        child_end.close()
        self._connection = Connection(parent_end.detach())
        self._ready = False
        self._send(pickle.dumps((warmup, (), STARTUP_TIMEOUT_S)), "warm-up")

    def call(self, request: bytes, description: str, timeout_s: float) -> tuple[bool, Any]:
        """Send a request made by `pickle_request` and wait at most `timeout_s` for the reply.

        Returns:
            (True, return value) or (False, the exception the call raised in the helper).

        Raises:
            ScoringTimeout: no reply within `timeout_s`; the helper has been killed.
            HelperProcessError: the helper could not start, or died during the call.
            Exception: whatever the warm-up raised; the helper has been killed.
        """
        if not self._ready:
            try:
                warmed_up, warmup_error = self._receive(STARTUP_TIMEOUT_S, "starting up")
            except ScoringTimeout as exc:  # a machine problem, not a slow sample
                raise HelperProcessError(f"the helper process {exc}") from None
            except HelperProcessError as exc:  # it will not start the next time either
                raise HelperStartError(str(exc)) from None
            if not warmed_up:  # e.g. a custom reward function that does not import
                self.kill()
                raise warmup_error
            self._ready = True
        self._send(request, description)
        return self._receive(timeout_s, description)

    def kill(self) -> None:
        """Stop the helper now; safe to call more than once."""
        self._process.kill()
        self._process.wait()
        self._connection.close()

    def _send(self, payload: bytes, description: str) -> None:
        try:
            self._connection.send_bytes(payload)
        except OSError as exc:  # the helper died while idle
            raise self._died(description) from exc

    def _receive(self, timeout_s: float, description: str) -> tuple[bool, Any]:
        if not self._connection.poll(timeout_s):
            self.kill()
            raise ScoringTimeout(f"{description} did not finish within {timeout_s:g} s")
        try:
            return pickle.loads(self._connection.recv_bytes())
        except (EOFError, OSError) as exc:
            raise self._died(description) from exc

    def _died(self, description: str) -> HelperProcessError:
        self.kill()
        return HelperProcessError(
            f"the helper process exited with code {self._process.returncode} while "
            f"{description}; its traceback, if any, is on this worker's stderr"
        )


def pickle_request(function: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> bytes:
    """Pickle a call for a helper; `function` must be importable by module and name."""
    try:
        return pickle.dumps((function, args, timeout_s))
    except Exception as exc:
        raise RewardError(
            f"cannot send a call of {function.__qualname__} to the helper process: {exc}. "
            "Its arguments, including any per-sample metadata, must be picklable."
        ) from exc


class BoundedProcessPool:
    """Helper processes shared by the threads of one process, each call bounded by a deadline.

    Concurrent callers get different helpers (a new one is started when none is idle), so a
    thread pool verifies in parallel; helpers are reused afterwards.

    Args:
        warmup: a picklable, argument-free function each new helper runs before its first call,
            outside any deadline, so that imports and caches do not eat into a call's budget.
            If it raises, the call that waited for it raises the same exception.
    """

    def __init__(self, warmup: Callable[[], Any] = _is_alive) -> None:
        self._warmup = warmup
        self._idle: list[HelperProcess] = []
        self._lock = threading.Lock()
        self._closed = False
        # Kill idle helpers when the pool is garbage-collected or the interpreter exits.
        self._finalizer = weakref.finalize(self, _kill_all, self._idle)

    def call(self, function: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        """Return `function(*args)` computed in a helper process, or raise what it raised.

        Raises:
            ScoringTimeout: the call took longer than `timeout_s` seconds.
            HelperProcessError: the helper could not start or died (a crash, `os._exit`, OOM).
            RewardError: the arguments could not be pickled.
            Exception: what `function`, or a new helper's warm-up, raised.
        """
        request = pickle_request(function, args, timeout_s)
        helper = self._take()
        try:
            succeeded, value = helper.call(request, f"running {function.__qualname__}", timeout_s)
        except (ScoringTimeout, HelperProcessError):
            self._put(HelperProcess(self._warmup))  # start the replacement before it is needed
            raise
        except BaseException:  # e.g. KeyboardInterrupt mid-call: the reply would come out of step
            helper.kill()
            raise
        self._put(helper)
        if succeeded:
            return value
        raise value

    def close(self) -> None:
        """Kill every helper; a helper in use is killed when its call returns."""
        with self._lock:
            self._closed = True
        self._finalizer()

    def _take(self) -> HelperProcess:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return HelperProcess(self._warmup)

    def _put(self, helper: HelperProcess) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(helper)
                return
        helper.kill()


def _kill_all(helpers: list[HelperProcess]) -> None:
    while helpers:
        helpers.pop().kill()


def _limit_cpu_time(seconds: float) -> None:
    """Let the kernel kill this process after `seconds` more CPU time (SIGXCPU).

    The parent kills at the wall-clock deadline; this is the backstop for when the parent has
    died and nobody will. It is set well above the deadline, so that it never races the parent,
    even for a custom reward function that computes on a few threads.
    """
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(used + 4 * seconds + 5)
    resource.setrlimit(
        resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard)
    )


def _portable(exc: Exception) -> Exception:
    """`exc` if it survives pickling back to the parent, else a RewardError that describes it."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RewardError(f"{type(exc).__name__}: {exc}")
    return exc


def serve(fd: int) -> None:
    """The helper's main loop: run one pickled call at a time until the parent goes away."""
    connection = Connection(fd)
    while True:
        try:
            request = connection.recv_bytes()
        except (EOFError, OSError):
            return  # the parent closed its end or died
        try:
            function, args, timeout_s = pickle.loads(request)
            _limit_cpu_time(timeout_s)
            reply = pickle.dumps((True, function(*args)))
        except Exception as exc:
            reply = pickle.dumps((False, _portable(exc)))
        try:
            connection.send_bytes(reply)
        except OSError:
            return  # the parent died while this call ran
