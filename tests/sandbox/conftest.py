"""Shared sandboxes for the tests in this directory, and a hard time limit per test.

Starting a local backend takes about a second (each slot probes its layers), so the tests
share one session-wide backend, started at the default minimum level (`full`). Where this
machine cannot reach that level (not root, no bubblewrap, no writable cgroup), the tests that
need it skip and say which layers are missing.
"""

from __future__ import annotations

import faulthandler
import os
import secrets

import pytest

from tests.sandbox.backends import start_backend

TEST_TIME_LIMIT_S = 120
"""No test here may run longer: past it, the whole run stops with every thread's traceback."""

SECRET_VARIABLE = "SATSEQ_SANDBOX_TEST_SECRET"


@pytest.fixture(autouse=True)
def _time_limit():
    faulthandler.dump_traceback_later(TEST_TIME_LIMIT_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session")
def host_secret():
    """A secret in this process's environment from before any sandbox starts; no run may
    ever see it."""
    secret = f"satseq-host-secret-{secrets.token_hex(8)}"
    os.environ[SECRET_VARIABLE] = secret
    yield secret
    del os.environ[SECRET_VARIABLE]


@pytest.fixture(scope="session")
def sandbox(host_secret):
    """The default local backend (minimum level `full`) with 4 slots."""
    backend = start_backend(workers=4)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def one_slot():
    """A backend of one slot, for a module whose every run must follow the one before it in
    the same sandbox."""
    backend = start_backend(workers=1)
    yield backend
    backend.close()
