"""Training survives actor and node loss ([2.5]): real SIGKILLs of a rollout actor and of a
learner mid-stage, and a node removed from a 2-node cluster (then a resume from the run's
storage alone). Each test kills only processes of the run it started (descendants of its
driver, or a node of its own cluster), by pid."""

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.cluster.runs import (
    STRAIGHT_STAGES,
    in_process_run,
    read_metrics,
    run_env,
    train_command,
    without_timings,
)

pytestmark = pytest.mark.slow


def titles(root: int) -> dict[int, str]:
    """The processes below `root` (the driver, and the Ray instance it started), by pid, with
    their titles: one pass over /proc (psutil's parent map), however deep the tree."""
    found = {}
    with contextlib.suppress(psutil.NoSuchProcess):
        for process in psutil.Process(root).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                found[process.pid] = " ".join(process.cmdline()).strip()  # Ray pads its titles
    return found


def wait_for_process(
    driver: subprocess.Popen, title: str, root: int | None = None, timeout_s: float = 600
) -> int:
    """The pid of a descendant of `root` (default: the driver) whose title starts with `title`,
    once one runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert driver.poll() is None, "the run ended before the process to kill appeared"
        for pid, process_title in titles(root or driver.pid).items():
            if process_title.startswith(title):
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no {title} process within {timeout_s} s")


def wait_for_stages(output_dir: Path, n: int, driver: subprocess.Popen) -> None:
    deadline = time.monotonic() + 600
    while not ((output_dir / "metrics.jsonl").exists() and len(read_metrics(output_dir)) >= n):
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)


def without_faults(record: dict) -> dict:
    return {k: v for k, v in without_timings(record).items() if not k.startswith("faults/")}


@pytest.fixture(scope="module")
def straight_metrics(straight_run):
    return read_metrics(straight_run)


def start_run(output_dir: Path, *extra: str, stages: int = STRAIGHT_STAGES) -> subprocess.Popen:
    return subprocess.Popen(
        train_command(output_dir, stages, *extra),
        env=run_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(driver: subprocess.Popen) -> None:
    try:
        _, stderr = driver.communicate(timeout=900)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 0, stderr[-3000:]


def test_a_rollout_actor_killed_mid_stage_is_restarted_and_the_stage_retried(
    tmp_path, straight_metrics
):
    driver = start_run(tmp_path)
    wait_for_stages(tmp_path, 1, driver)  # stage 1 restarts from stage 0's checkpoint
    os.kill(wait_for_process(driver, "ray::RolloutWorker.generate"), signal.SIGKILL)
    started = time.monotonic()
    finish(driver)
    metrics = read_metrics(tmp_path)
    assert [without_faults(m) for m in metrics] == [without_faults(m) for m in straight_metrics]
    assert sum(m["faults/rollout"] for m in metrics) == 1
    assert sum(m["faults/learner"] for m in metrics) == 0
    recovery = sum(m.get("time/recovery", 0.0) for m in metrics)
    elapsed = time.monotonic() - started
    print(
        f"\nrollout actor: recovered in {recovery:.1f} s; run ended {elapsed:.0f} s after the kill"
    )


OVERLAPPED = ("--set", "rollout.max_staleness=1")


def test_overlapped_stages_survive_a_rollout_actor_killed_while_generating_ahead(tmp_path):
    """rollout.max_staleness 1 ([3.4]): from stage 1 on, the next stage's rollouts are being
    generated while this stage's learners update. A rollout actor killed then fails that
    generation; the stage is retried from its checkpoint, whose queue holds what stage 0
    generated ahead, and the run's metrics are those of the uninterrupted overlapped run."""
    reference = in_process_run(tmp_path / "reference", STRAIGHT_STAGES, *OVERLAPPED)
    driver = start_run(tmp_path / "killed", *OVERLAPPED)
    wait_for_stages(tmp_path / "killed", 1, driver)
    os.kill(wait_for_process(driver, "ray::RolloutWorker.generate"), signal.SIGKILL)
    finish(driver)
    metrics = read_metrics(tmp_path / "killed")
    expected = read_metrics(reference)
    assert [without_faults(m) for m in metrics] == [without_faults(m) for m in expected]
    assert [m["async/staleness_mean"] for m in metrics] == [0.0, 1.0, 1.0]
    assert sum(m["faults/rollout"] for m in metrics) == 1


def actor_processes(driver: subprocess.Popen, actor_class: str, idle: bool = False) -> set[int]:
    """The pids of the run's `actor_class` actors; with `idle`, of those between calls (Ray
    titles an idle actor's process `ray::<class>`, a busy one `ray::<class>.<method>`)."""
    return {
        pid
        for pid, title in titles(driver.pid).items()
        if title == f"ray::{actor_class}" or (not idle and title.startswith(f"ray::{actor_class}."))
    }


def kill_between_calls(driver: subprocess.Popen, actor_classes: tuple[str, ...]) -> None:
    """SIGKILL one actor of each class while it is between calls, the coordinator held
    (SIGSTOP) from before the kills until Ray has restarted them all, so the restarts always
    win the race with the coordinator's next calls."""
    coordinator = wait_for_process(driver, "ray::Coordinator")
    os.kill(coordinator, signal.SIGSTOP)
    deadline = time.monotonic() + 120
    try:
        for actor_class in actor_classes:
            while not (idle := actor_processes(driver, actor_class, idle=True)):
                assert time.monotonic() < deadline, f"no {actor_class} between calls"
                time.sleep(0.05)
            known = actor_processes(driver, actor_class)
            os.kill(min(idle), signal.SIGKILL)
            while not actor_processes(driver, actor_class, idle=True) - known:  # the restarted
                assert time.monotonic() < deadline, f"Ray did not restart the {actor_class}"
                time.sleep(0.05)
    finally:
        os.kill(coordinator, signal.SIGCONT)


def test_learners_and_rollout_actors_killed_mid_call_or_between_calls_leave_the_run_as_it_was(
    tmp_path, straight_metrics
):
    """Stage 0: a learner killed mid-update fails the call; Ray restarts it and the stage is
    retried (no checkpoint yet: every learner restarts from the initial weights).
    Stage 1 or later: a learner and a rollout actor killed between two calls fail no call; their
    next calls reach processes on initial weights (without the check the run goes on from
    there, and its metrics part from the uninterrupted run's). Their new incarnations give them
    away before the stage's checkpoint, and the stage is retried. The run's metrics are the
    uninterrupted run's."""
    driver = start_run(tmp_path)
    os.kill(wait_for_process(driver, "ray::Learner.update"), signal.SIGKILL)
    wait_for_stages(tmp_path, 1, driver)  # trained weights: a restart on initial ones shows
    kill_between_calls(driver, ("Learner", "RolloutWorker"))
    finish(driver)
    metrics = read_metrics(tmp_path)
    assert [without_faults(m) for m in metrics] == [without_faults(m) for m in straight_metrics]
    assert any(m["accepted/a0"] > 0 for m in metrics)  # the runs learned: equality is not trivial
    assert metrics[0]["faults/learner"] == 1
    # one recovery finds both restarts, named after the first to surface: the incarnation
    # check asks the learners first, but on a loaded machine the stage's first call can meet the
    # restarted rollout actor before it (Ray: "the actor was restarted")
    assert sum(m["faults/learner"] + m["faults/rollout"] for m in metrics[1:]) == 1
    assert metrics[0]["faults/rollout"] == 0
    print(f"\nlearner killed mid-update: recovered in {metrics[0]['time/recovery']:.1f} s")


def test_a_run_without_retries_left_stops_with_what_died(tmp_path, builtin_models):
    driver = start_run(tmp_path, "--set", "trainer.max_stage_retries=0")
    os.kill(wait_for_process(driver, "ray::RolloutWorker.generate"), signal.SIGKILL)
    _, stderr = driver.communicate(timeout=600)
    assert driver.returncode != 0
    assert "trainer.max_stage_retries=0" in stderr and "rollout 1×" in stderr


def raylet_pid(node) -> int:
    return node.all_processes["raylet"][0].process.pid


def test_a_node_removed_mid_run_and_its_files_lost_the_run_finishes_and_resumes_from_storage(
    tmp_path, builtin_models
):
    """[2.5] and [4.4]: on a 2-node cluster the node of the team's actors is removed mid-run,
    and the run finishes on a spare node; everything a resume needs went to `output.storage`
    (checkpoints, saved stages, the saved config and the logs), so with the outputs dir deleted
    (what the lost nodes' disks took), a resume on the cluster into the empty directory
    continues from the last stage."""
    from ray.cluster_utils import Cluster

    run = tmp_path / "run"
    # Loopback only: the driver would otherwise turn 127.0.0.1 into this machine's address
    env = run_env() | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    loopback = {"node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, **loopback})
    doomed = cluster.add_node(num_cpus=2, **loopback)  # the whole team's placement group fits
    on_cluster = ("--set", f"output.storage={tmp_path / 'storage'}", "--address", cluster.address)
    stages = 2 * STRAIGHT_STAGES  # the removal lands in stage 1 or 2: the coordinator is held
    driver = subprocess.Popen(
        train_command(run, stages, *on_cluster),
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the coordinator (no resources) runs beside the driver, on the head node; it is held
        # (SIGSTOP) from the end of stage 0 until the node is gone, so that the removal lands
        # mid-run however long adding the spare node takes and however fast the stages go
        coordinator = wait_for_process(
            driver, "ray::Coordinator", root=raylet_pid(cluster.head_node)
        )
        wait_for_stages(run, 1, driver)
        os.kill(coordinator, signal.SIGSTOP)
        try:
            cluster.add_node(num_cpus=2, **loopback)  # where the team goes once `doomed` is gone
            # the rollout actor is a process of the doomed node
            wait_for_process(driver, "ray::RolloutWorker", root=raylet_pid(doomed))
            cluster.remove_node(doomed)
        finally:
            os.kill(coordinator, signal.SIGCONT)
        started = time.monotonic()
        finish(driver)
        metrics = read_metrics(run)
        assert [m["stage"] for m in metrics] == list(range(stages))
        assert sum(sum(v for k, v in m.items() if k.startswith("faults/")) for m in metrics) >= 1
        print(f"\nnode loss: run ended {time.monotonic() - started:.0f} s after the removal")

        shutil.rmtree(run)
        resume = train_command(run, stages + 1, *on_cluster, "--resume")
        resumed = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert [m["stage"] for m in read_metrics(run)] == list(range(stages + 1))
        assert sorted(p.name for p in (run / "agent_a1").iterdir()) == [f"stage_{stages}"]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        cluster.shutdown()


ONE_BASE_LORA = (  # three LoRA agents on one base: their learners share one process
    "--set", "trainer.lora.rank=8",
    "--set", "team.agents.1.path=builtin:tiny-carry-0",
    "--set", "team.agents.2.path=builtin:tiny-carry-0",
)  # fmt: skip


def test_the_lora_learners_shared_process_killed_mid_call_restores_every_agent_it_held(tmp_path):
    """The LoRA agents of one base have one learner process (`LearnerHost`), and no other
    learner runs. Killed in stage 1 mid-call, it takes all three agents' learners with it: Ray
    restarts it, every agent is restored from stage 0's checkpoint, and the run's metrics are
    the uninterrupted run's."""
    reference = in_process_run(tmp_path / "reference", 2, *ONE_BASE_LORA)
    killed = tmp_path / "killed"
    driver = start_run(killed, *ONE_BASE_LORA, stages=2)
    wait_for_stages(killed, 1, driver)
    host = wait_for_process(driver, "ray::LearnerHost.call")
    assert actor_processes(driver, "LearnerHost") == {host}
    assert actor_processes(driver, "Learner") == set()  # no learner of its own
    os.kill(host, signal.SIGKILL)
    finish(driver)
    metrics, expected = read_metrics(killed), read_metrics(reference)
    assert [without_faults(m) for m in metrics] == [without_faults(m) for m in expected]
    assert all(m[f"accepted/{a}"] > 0 for m in metrics for a in ("a0", "a1", "a2"))
    assert [m["faults/learner"] for m in metrics] == [0, 1]
