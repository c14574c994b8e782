"""`ray job submit --working-dir . -- satseq train ...` against a local `ray start --head`."""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.cluster.runs import SHORT_RUN, free_port, read_metrics, run_env

pytestmark = pytest.mark.slow
RAY = str(Path(sys.executable).parent / "ray")
REPO = Path(__file__).resolve().parents[2]


def stop_head(temp_dir: str) -> None:
    """SIGKILL the head started with `--temp-dir temp_dir` and every process under it (`ray
    stop` would stop every Ray instance on the machine, another test's too)."""
    head = [
        process
        for process in psutil.process_iter(["cmdline"])
        if any(temp_dir in argument for argument in process.info["cmdline"] or ())
    ]
    processes = set(head)
    for process in head:
        with contextlib.suppress(psutil.NoSuchProcess):
            processes.update(process.children(recursive=True))
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(processes, timeout=60)
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit_runs_training_on_a_loopback_cluster(tmp_path, builtin_models):
    gcs_port, dashboard_port = free_port(), free_port()
    # Ray's sockets live under the temp dir, whose path must stay short (108 bytes a socket)
    temp_dir = tempfile.mkdtemp(prefix="satseq-ray-")
    # Ray's token authentication, as a real cluster runs it: the head and the CLI share a token.
    # The cluster's PATH has satseq on it, as an image with the project installed does.
    venv_bin = str(Path(sys.executable).parent)
    env = run_env() | {"RAY_AUTH_MODE": "token", "PATH": f"{venv_bin}:{os.environ['PATH']}"}
    subprocess.run(
        [RAY, "get-auth-token", "--generate"], check=True, timeout=60, env=env, capture_output=True
    )
    subprocess.run(
        [
            RAY,
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={gcs_port}",
            "--num-cpus=2",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}",
            # the job agent's HTTP port: Ray's default (52365) is taken whenever another Ray
            # instance runs on the machine (a test beside this one), and then no job is taken
            f"--dashboard-agent-listen-port={free_port()}",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
        ],
        check=True,
        timeout=180,
        env=env,
    )
    try:
        output_dir = tmp_path / "job_run"
        submit = [
            RAY,
            "job",
            "submit",
            f"--address=http://127.0.0.1:{dashboard_port}",
            "--working-dir",
            str(REPO),
            "--",
            "satseq",
            "train",
            *SHORT_RUN,
            "--set",
            "trainer.stages=1",
            "--output-dir",
            str(output_dir),
        ]
        # Right after `ray start` the head's job agent may not be registered yet; Ray answers
        # that with "No available agent ... try again later" (seen on a loaded 2-core machine).
        deadline = time.monotonic() + 300
        while True:
            job = subprocess.run(submit, capture_output=True, text=True, timeout=900, env=env)
            if "No available agent" not in job.stderr or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "succeeded" in job.stdout
        assert [m["stage"] for m in read_metrics(output_dir)] == [0]
    finally:
        stop_head(temp_dir)
