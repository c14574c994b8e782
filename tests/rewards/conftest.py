"""Scorers shared by the reward tests: each one starts a helper process (~0.5 s) on first use."""

import pytest

from satseq.rewards import RewardScorer


@pytest.fixture(scope="session")
def scorer():
    """The built-in math-verify scorer with the default fallbacks and a generous deadline."""
    with RewardScorer(timeout_s=10.0) as shared:
        yield shared


@pytest.fixture(scope="session")
def percent_scorer():
    """Like `scorer`, but "10%" may also be read as 0.1."""
    with RewardScorer(allow_percent=True, timeout_s=10.0) as shared:
        yield shared


@pytest.fixture(scope="session")
def impatient_scorer():
    """A short deadline, for inputs that would hang the parser or the comparison."""
    with RewardScorer(timeout_s=0.5) as shared:
        yield shared
