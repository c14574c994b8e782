"""The coordinator's whole stage loop in one process (`start_in_process`, no Ray): its outputs,
checkpoints and resume, in seconds where the SIGKILL tests (`test_train_resume`) take minutes."""

import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from satseq.cluster.coordinator import Coordinator
from satseq.cluster.team import start_in_process
from satseq.config import QUICKSTART, load_config
from tests.cluster.runs import read_metrics, without_timings

STAGES = 3


@pytest.fixture(scope="module")
def config(builtin_models):
    model_path = load_config(QUICKSTART).team.agents[0].path
    agents = ", ".join(f"{{name: a{i}, path: '{model_path}'}}" for i in range(2))
    return load_config(
        QUICKSTART,
        [
            f"team.agents=[{agents}]",
            f"trainer.stages={STAGES}",
            "trainer.batch_size=4",
            "sat_seq.group_size=4",
            "rollout.max_new_tokens=24",
            "data.synthetic.n_train=32",
            "output.trackers=[]",
            "output.keep_last=1",
        ],
    )


def train(config, output_dir, until_stage, resume=False):
    """Stages up to `until_stage` in this process, from a seeded start as a fresh process has;
    the coordinator, closed."""
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    coordinator = Coordinator(config, str(output_dir), resume, start_team=start_in_process)
    started_at = coordinator.stage
    while coordinator.stage < until_stage:
        coordinator.run_stage()
    coordinator.close()
    return started_at


def test_a_run_stopped_after_a_stage_resumes_to_the_uninterrupted_runs_metrics_and_weights(
    config, tmp_path
):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train(config, straight, STAGES) == 0
    assert train(config, resumed, 1) == 0  # stopped after stage 0's checkpoint
    assert train(config, resumed, STAGES, resume=True) == 1

    assert [without_timings(m) for m in read_metrics(resumed)] == [
        without_timings(m) for m in read_metrics(straight)
    ]
    for run in (straight, resumed):  # keep_last 1: only the last stage's directories stay
        assert sorted(p.name for p in (run / "agent_a0").iterdir()) == [f"stage_{STAGES - 1}"]
    for agent in ("a0", "a1"):
        last = f"agent_{agent}/stage_{STAGES - 1}/model.safetensors"
        expected, found = load_file(straight / last), load_file(resumed / last)
        assert expected.keys() == found.keys()
        assert all(torch.equal(expected[name], found[name]) for name in expected)
