"""A short real training observed as a user would: `scripts/train_dapo.sh` joins a Ray instance
that exports metrics on a known port, and the Prometheus text is scraped once the last stage's
gauges arrive. Run as a script (its own process owns Ray, so the test process never does):

    python -m tests.deploy.observed_run OUTPUT_DIR

writes OUTPUT_DIR/run/ (the training outputs) and OUTPUT_DIR/ray_metrics.txt (the scrape).
"""

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import ray

from tests.cluster.runs import free_port, run_env

REPO = Path(__file__).resolve().parents[2]
TRAIN_DAPO = REPO / "scripts" / "train_dapo.sh"
STAGES = 2
# configs/sat_seq.yaml made small enough for 2 CPU cores with no network: the seeds' variables
# set the stages, batch and agents; these arguments pass through the script to `satseq train`.
SEEDS_ENV = {
    "NUM_STAGES": str(STAGES),
    "TRAIN_BATCH_SIZE": "4",
    "AGENT1_PATH": "builtin:tiny",
    "AGENT2_PATH": "builtin:tiny",
    "AGENT3_PATH": "builtin:tiny",
}
CPU_OVERRIDES = [
    f"--set={key}={value}"
    for key, value in {
        "data.train": "synthetic",
        "data.synthetic.split": "test",
        "data.synthetic.n_train": 48,
        "rollout.engine": "hf",
        "rollout.num_actors": 1,
        "rollout.max_new_tokens": 32,
        "rollout.resources": "{num_cpus: 0.5, num_gpus: 0}",
        "trainer.resources": "{num_cpus: 0.5, num_gpus: 0}",
        "trainer.workers_per_agent": 1,  # the config shards each 4B agent over 2 GPUs
        "trainer.dtype": "float32",
        "trainer.gradient_checkpointing": "false",
        "trainer.lr": 3.0e-4,
        "trainer.val_every": 0,  # the config validates on MATH-500, a hub dataset
        # two held-out prompts of four: the per-prompt bound needs n ≥ 2 to be finite
        "algorithm.certificate.holdout_fraction": 0.5,
    }.items()
]
SCRAPE_TIMEOUT_S = 90  # Ray's metrics agent exports every few seconds
RAY_START_ATTEMPTS = 3  # each on a new metrics port


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def wait_for_last_stage(port: int) -> str:
    """The scrape once `ray_satseq_stage` reports the run's last stage."""
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    last_stage_line = f"}} {float(STAGES - 1)}"
    while True:
        text = scrape(port)
        if any(
            line.startswith("ray_satseq_stage{") and line.endswith(last_stage_line)
            for line in text.splitlines()
        ):
            return text
        if time.monotonic() > deadline:
            raise TimeoutError(f"no ray_satseq_stage = {STAGES - 1} within {SCRAPE_TIMEOUT_S} s")
        time.sleep(2)


def start_ray_exporting_metrics() -> int:
    """A local Ray instance whose metrics agent serves on a free port; that port. The port is
    free when probed, but Ray's own processes bind ephemeral ports as they start, and one can
    take it first: the agent then exits and Ray's start fails, so a new port is tried."""
    attempts_left = RAY_START_ATTEMPTS
    while True:
        port = free_port()
        try:
            ray.init(
                address="local",
                num_cpus=2,
                include_dashboard=False,
                log_to_driver=False,
                _metrics_export_port=port,
            )
            return port
        except Exception:  # Ray says only "The current node timed out during startup"
            ray.shutdown()
            attempts_left -= 1
            if not attempts_left:
                raise


def main(out: Path) -> None:
    port = start_ray_exporting_metrics()
    try:
        venv_bin = str(Path(sys.executable).parent)
        env = (
            run_env()
            | SEEDS_ENV
            | {
                "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
                "OUTPUT_DIR": str(out / "run"),
                "PATH": f"{venv_bin}:{run_env()['PATH']}",
            }
        )
        subprocess.run([str(TRAIN_DAPO), *CPU_OVERRIDES], env=env, check=True, timeout=900)
        (out / "ray_metrics.txt").write_text(wait_for_last_stage(port))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
