"""Helpers for end-to-end training runs: the real `satseq` command on real Ray."""

import json
import os
import random
import sys
from pathlib import Path

from satseq.actors.sharding import free_address
from satseq.config import QUICKSTART, RunConfig, load_config
from satseq.data import make_split
from satseq.offline import write_offline_values

SATSEQ = str(Path(sys.executable).parent / "satseq")
# A short quickstart: 3 agents, 4 prompts × G=8 per stage, 1 held out for the certificate,
# validated on 32 held-out problems.
SHORT_RUN = [
    "--set", "trainer.batch_size=4",
    "--set", "rollout.max_new_tokens=32",
    "--set", "eval.synthetic_problems=32",
]  # fmt: skip
STRAIGHT_STAGES = 3  # the shared reference run's (`straight_run`)
TIMING_KEYS = ("time/", "tokens_per_s/", "util/")  # what differs between runs: timings
# 8 prompts and 4 per stage: prompts come back within a few stages, so ρ 'kl' re-scores them.
# builtin:tiny's own task: difficulty 1, on 'test' (it was warm-started on 'train' and 'warmup')
SPO_RUN = [
    "--set", "algorithm.name=spo",
    "--set", "data.synthetic.difficulty=1",
    "--set", "data.synthetic.split=test",
    "--set", "data.synthetic.n_train=8",
    "--set", "eval.synthetic_problems=32",  # validation: level 1 holds ~175 test problems
    "--set", "team.agents=[{name: a0, path: 'builtin:tiny'}, {name: a1, path: 'builtin:tiny'}]",
]  # fmt: skip
SPO_STAGES = 4  # test_train_spo's SPO run: revisited prompts from stage 2 on


def train_command(output_dir: Path, stages: int, *extra: str) -> list[str]:
    return [
        SATSEQ,
        "train",
        *SHORT_RUN,
        "--set",
        f"trainer.stages={stages}",
        "--output-dir",
        str(output_dir),
        *extra,
    ]


def short_quickstart(stages: int, *extra: str) -> RunConfig:
    """The quickstart as `train_command` shortens it (SHORT_RUN), `stages` stages, then
    `extra` (`--set KEY=VALUE` arguments)."""
    overrides = [arg for arg in [*SHORT_RUN, *extra] if arg != "--set"]
    return load_config(QUICKSTART, [*overrides, f"trainer.stages={stages}"])


def train(config: RunConfig, output_dir: Path, until_stage: int, resume: bool = False) -> int:
    """Stages up to `until_stage` in this process (`start_in_process`, no Ray), from a seeded
    start as a fresh process has; the stage it started at. The coordinator is closed."""
    import numpy as np
    import torch

    from satseq.cluster.coordinator import Coordinator
    from satseq.cluster.team import start_in_process

    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    coordinator = Coordinator(config, str(output_dir), resume, start_team=start_in_process)
    started_at = coordinator.stage
    while coordinator.stage < until_stage and not coordinator.finished():
        coordinator.run_stage()
    coordinator.close()
    return started_at


def in_process_run(output_dir: Path, stages: int, *extra: str) -> Path:
    """`train_command(output_dir, stages, *extra)`'s run trained in this process: its metrics
    and weights are the Ray run's, bit for bit (test_coordinator_in_process holds the two to
    each other), at a fraction of the cost (no Ray instance, no actor processes to start)."""
    train(short_quickstart(stages, *extra, "--set", "output.trackers=[]"), output_dir, stages)
    return output_dir


def spo_run_args(root: Path) -> list[str]:
    """SPO_RUN with offline scores (3 successes in 4) for 6 of its 8 prompts, written to
    root/values.json: the other 2 start at Beta(0.5, 0.5)."""
    problems = make_split("test", 8, seed=0, difficulty=1, style="symbols")
    values = {p.problem: [1.0, 0.0, 1.0, 1.0] for p in problems[:6]}
    values_file = write_offline_values(values, root / "values.json")
    return [*SPO_RUN, "--set", f"spo.offline_values={values_file}"]


def run_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    return env


def read_metrics(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(TIMING_KEYS)}


def free_port() -> int:
    """A loopback port nothing listens on (until the caller starts something there)."""
    return int(free_address("127.0.0.1").rsplit(":", 1)[1])
