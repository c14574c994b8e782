"""`bench/bench_async_runs.py`: its core pinning puts a run's rollout actors and learners (by their
Ray process titles) on separate cores, every thread and child of them, and its steady-stage means
are those of the stages between the first and the last."""

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).parent.parent


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import bench_async_runs

    return bench_async_runs


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2,
    reason="one core: the rollout actors and the learners have no separate cores to be pinned to",
)
def test_rollout_actors_and_learners_are_pinned_to_their_own_cores(bench):
    rollout_cores, learner_cores = bench.split_cores()
    assert rollout_cores and learner_cores and not rollout_cores & learner_cores
    tree = (
        "(exec -a ray::satseq-rollout-0:RolloutWorker.generate sh -c 'sleep 5 & wait') & "
        "(exec -a ray::satseq-learner-a0:Learner.__init__ sleep 5) & "
        "(exec -a ray::LearnerRank.update sleep 5) & "  # a started actor: titled by class
        "(exec -a ray::satseq-coordinator sleep 5) & wait"
    )
    driver = subprocess.Popen(["bash", "-c", tree])
    pinning = bench.CorePinning(driver.pid, rollout_cores, learner_cores, period_s=0.1)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(pinning.pinned.values()):
            time.sleep(0.1)
        time.sleep(0.3)  # one more scan: the rollout actor's child
        affinity = {}
        for process in psutil.Process(driver.pid).children(recursive=True):
            title = " ".join(process.cmdline())
            affinity[title] = os.sched_getaffinity(process.pid)
    finally:
        driver.kill()
        pinning.stop()
    rollout = [a for title, a in affinity.items() if "satseq-rollout" in title]
    assert rollout == [rollout_cores]
    assert affinity["sleep 5"] == rollout_cores  # the rollout actor's own child
    learner = [a for title, a in affinity.items() if "Learner" in title]
    assert learner == [learner_cores, learner_cores]
    coordinator = [a for title, a in affinity.items() if "satseq-coordinator" in title]
    assert coordinator == [os.sched_getaffinity(0)]  # left where the OS puts it


def test_steady_means_leave_out_the_first_and_the_last_stage(bench):
    stages = [
        {"time/rollout": 9.0, "util/engine_busy": 0.9},
        {"time/rollout": 2.0, "time/update": 2.0, "util/engine_busy": 0.5, "async/dropped": 3},
        {
            "time/rollout": 1.0,
            "time/update": 1.0,
            "util/engine_busy": 0.25,
            "util/learner_busy": 0.5,
            "async/staleness_mean": 1.0,
            "rollout/correction_weight_mean": 0.9,
            "rollout/correction_weight_min": 0.4,
            "rollout/logprob_mismatch": 0.02,
        },
        {"time/rollout": 7.0, "util/engine_busy": 0.1, "async/dropped": 1},
    ]
    means = bench.steady_means(stages)
    assert means["stage_s"] == pytest.approx(3.0)  # (4 + 2) / 2
    assert means["engine_busy"] == pytest.approx(0.375)
    assert means["engine_idle_s"] == pytest.approx((4 * 0.5 + 2 * 0.75) / 2)
    assert means["learner_busy"] == pytest.approx(0.25)
    assert means["staleness"] == pytest.approx(0.5)
    assert means["dropped"] == 4  # counted over every stage
    assert means["weight_mean"] == pytest.approx(0.95)
    assert means["weight_min"] == pytest.approx(0.4)
    assert means["mismatch"] == pytest.approx(0.01)
