"""Shared fixtures for actor tests: a barely-trained tiny model built once per session."""

import pytest

from satseq.models import build_tiny_model


@pytest.fixture(scope="session")
def raw_tiny_model(tmp_path_factory):
    """A tiny Qwen2 model with one warm-start step: builds in seconds, behaves like any policy."""
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", warm_start_steps=1))
