"""Joining a Ray cluster: the one place every command (train, eval, serve, estimate) does it."""

from __future__ import annotations

import os

import ray


def connect(address: str | None) -> None:
    """Join the cluster at `address` (or $RAY_ADDRESS), else start a local Ray instance."""
    address = address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        # "local": a new instance, never one that `ray start` left running on this machine
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
