"""Kill the driver with SIGKILL after a checkpoint, resume, and get the uninterrupted run's
metrics exactly (timings aside)."""

import os
import signal
import subprocess
import time

import pytest

from tests.cluster.runs import (
    STRAIGHT_STAGES,
    read_metrics,
    run_env,
    train_command,
    without_timings,
)

pytestmark = pytest.mark.slow


# One agent sharded over two learner ranks (FSDP2 on gloo) beside the rollout actor: the sharded
# ranks' own checkpoint files. Each recipe's resume state (GAE's value heads, SPO's trackers) is
# held to the uninterrupted run in process (`test_coordinator_in_process`); here the driver and
# its Ray instance are killed.
SHARDED = [
    "--set", "trainer.workers_per_agent=2", "--set", "trainer.resources.num_cpus=0.5",
    "--set", "team.agents=[{name: a0, path: 'builtin:tiny-carry-0'}]",
]  # fmt: skip


@pytest.mark.parametrize("algorithm", ["sat_seq", "sat_seq_sharded"])
def test_resume_after_sigkill_reproduces_the_uninterrupted_run(
    tmp_path, request, builtin_models, algorithm
):
    """The quickstart team (compared with the run the fault tests compare with too), and one
    sharded agent, whose ranks save their shards with `torch.distributed.checkpoint` (2 stages:
    killed after the first, its second trained from the shards)."""
    if algorithm == "sat_seq":
        stages, straight, extra = STRAIGHT_STAGES, request.getfixturevalue("straight_run"), []
    else:
        stages, straight, extra = 2, tmp_path / "straight", SHARDED
        command = train_command(straight, stages, *extra)
        subprocess.run(command, check=True, timeout=600, env=run_env())

    interrupted = tmp_path / "interrupted"
    driver = subprocess.Popen(
        train_command(interrupted, stages, *extra),
        env=run_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    first_checkpoint = interrupted / "checkpoints" / "stage_0" / "run.pt"
    deadline = time.monotonic() + 600
    while not first_checkpoint.exists():
        assert driver.poll() is None, "the driver ended before writing its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint within 600 s"
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and the Ray instance it started
    driver.wait(timeout=60)
    completed = len(read_metrics(interrupted))
    assert completed < stages, "the run finished before it could be killed"

    subprocess.run(
        train_command(interrupted, stages, *extra, "--resume"),
        check=True,
        timeout=600,
        env=run_env(),
    )
    resumed = read_metrics(interrupted)
    reference = read_metrics(straight)
    assert [m["stage"] for m in resumed] == list(range(stages))
    assert [without_timings(m) for m in resumed] == [without_timings(m) for m in reference]
    # the runs learned something, so equality is not the trivial equality of untouched weights
    assert any(m["accepted/a0"] > 0 for m in reference)


def test_ctrl_c_finishes_the_stage_checkpoints_and_exits_cleanly(tmp_path, builtin_models):
    output_dir = tmp_path / "interrupted"
    driver = subprocess.Popen(
        train_command(output_dir, 4),
        env=run_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 600
    while not (output_dir / "metrics.jsonl").exists():
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    driver.send_signal(signal.SIGINT)
    output, _ = driver.communicate(timeout=600)
    assert driver.returncode == 0, output[-2000:]
    assert "continue with --resume" in output
    stages_done = len(read_metrics(output_dir))
    assert 1 <= stages_done < 4
    assert (output_dir / "checkpoints" / f"stage_{stages_done - 1}" / "run.pt").exists()
