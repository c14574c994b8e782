"""Joining a Ray cluster: the one place every command (train, eval, serve, estimate) does it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from satseq.model_trust import TRUSTED_ENV


def connect(address: str | None) -> None:
    """Join the cluster at `address` (or $RAY_ADDRESS), else start a local Ray instance."""
    address = address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        return
    # every worker reads the models the command trusts with their own code (`models.trust`)
    trusted = os.environ.get(TRUSTED_ENV)
    runtime_env = {"env_vars": {TRUSTED_ENV: trusted}} if trusted else None
    if address:
        ray.init(address=address, log_to_driver=False, runtime_env=runtime_env)
    else:
        # "local": a new instance, never one that `ray start` left running on this machine
        ray.init(
            address="local", include_dashboard=False, log_to_driver=False, runtime_env=runtime_env
        )


@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """`connect` for the span of a `with` block; a Ray instance it started is shut down after."""
    started = not ray.is_initialized()
    connect(address)
    try:
        yield
    finally:
        if started:
            ray.shutdown()
