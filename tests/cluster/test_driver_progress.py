"""The driver's progress line: phase, agent, the last stage's reward and backtracks, and each
agent's peak device memory in its last update where the device reports one (CUDA)."""

from satseq.cluster.driver import _describe


def test_the_progress_line_shows_each_agents_update_peak_where_there_is_one():
    stage = {"reward/mean": 0.5, "backtracks/a0": 1, "backtracks/a1": 2}
    cuda_stage = {**stage, "memory/peak_gib/a0": 12.34, "memory/peak_gib/a1": 3.0}
    line = _describe({"phase": "update", "agent": "a1"}, [cuda_stage])
    assert line == "update  agent a1  reward 0.500  backtracks 3  update peak GiB a0 12.3 a1 3.0"
    assert "peak" not in _describe({"phase": "rollout"}, [stage])  # the CPU reports none


def test_the_progress_line_names_a_tracker_the_run_goes_on_without():
    line = _describe({"phase": "rollout", "trackers_failed": ["mlflow"]}, [])
    assert line == "rollout  [yellow]not logging to mlflow"


def test_the_progress_line_shows_how_stale_overlapped_rollouts_are():
    stage = {"reward/mean": 0.5, "async/staleness_mean": 1.0}
    assert "staleness 1" in _describe({"phase": "update"}, [stage])
    assert "staleness" not in _describe({"phase": "update"}, [{"reward/mean": 0.5}])
