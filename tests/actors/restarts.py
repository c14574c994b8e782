"""Killing a Ray actor for real and waiting for Ray to restart it."""

import os
import signal
import time

import ray
from ray.exceptions import RayActorError


def sigkill_until_restarted(actor, timeout_s: float = 120.0) -> None:
    """SIGKILL `actor`'s process; return once Ray has restarted it under the same handle (its
    `incarnation()` answers from a new process)."""
    first = ray.get(actor.incarnation.remote())
    os.kill(ray.get(actor.__ray_call__.remote(lambda _: os.getpid())), signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ray.get(actor.incarnation.remote()) != first:
                return
        except RayActorError:  # the dead process, or one still restarting
            pass
        assert time.monotonic() < deadline, "Ray did not restart the actor"
        time.sleep(0.2)
