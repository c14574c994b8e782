"""Kill the driver with SIGKILL after a checkpoint, resume, and get the uninterrupted run's
metrics exactly (timings aside)."""

import os
import signal
import subprocess
import time

import pytest

from tests.cluster.runs import (
    SPO_STAGES,
    STRAIGHT_STAGES,
    read_metrics,
    run_env,
    train_command,
    without_timings,
)

pytestmark = pytest.mark.slow


# The runs of their own; sat_seq and spo compare with the shared runs (`straight_run`, `spo_run`)
EXTRA_ARGS = {
    "sat_seq_gae": ["--set", "sat_seq.advantage=gae"],
    # one agent sharded over two learner ranks (FSDP2 on gloo) beside the rollout actor: the
    # other variants resume teams; more ranks on 2 cores only take longer
    "sat_seq_sharded": [
        "--set", "trainer.workers_per_agent=2", "--set", "trainer.resources.num_cpus=0.5",
        "--set", "team.agents=[{name: a0, path: 'builtin:tiny-carry-0'}]",
    ],
}  # fmt: skip


@pytest.mark.parametrize("algorithm", ["sat_seq", *EXTRA_ARGS, "spo"])
def test_resume_after_sigkill_reproduces_the_uninterrupted_run(
    tmp_path, request, builtin_models, algorithm
):
    """SPO's resume state adds the trackers (with their stored log-probs and offline priors) and
    the sampler RNG; `gae` mode's, the value heads and their optimisers; sharded agents', their
    ranks' shards (`torch.distributed.checkpoint`)."""
    if algorithm == "sat_seq":  # the plain quickstart's: the run the fault tests compare with too
        stages, extra = STRAIGHT_STAGES, []
        straight = request.getfixturevalue("straight_run")
    elif algorithm == "spo":  # the run `test_train_spo` checks
        stages = SPO_STAGES
        straight, extra = request.getfixturevalue("spo_run")
    else:
        stages, extra = STRAIGHT_STAGES, EXTRA_ARGS[algorithm]
        straight = tmp_path / "straight"
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
    if algorithm == "sat_seq_gae":  # the value heads learned, from V = 0 at the first stage
        assert reference[0]["value/mean/a0"] == 0.0
        assert all(m["value/loss/a0"] > 0 for m in reference)
        assert reference[-1]["value/mean/a0"] != 0.0


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
