"""The coordinator's whole stage loop in one process (`start_in_process`, no Ray): its outputs,
checkpoints and resume, in seconds where the SIGKILL tests (`test_train_resume`) take minutes;
each recipe's resume state (GAE's value heads, SPO's trackers and draw); and a resume from
`output.storage` on a real S3 server when the outputs dir lost them."""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from satseq.cluster.checkpoint import run_storage
from satseq.cluster.metric_keys import RUN_TOKENS, stage_tokens
from satseq.config import QUICKSTART, load_config
from satseq.config.trainer import TrainerConfig
from tests.cluster.runs import (
    STRAIGHT_STAGES,
    in_process_run,
    read_metrics,
    spo_run_args,
    train,
    without_timings,
)

STAGES = 3


def short_run(*overrides: str):
    """The quickstart with two agents of its model, STAGES short stages, then `overrides`."""
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
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
def config(builtin_models):
    return short_run()


@pytest.fixture(scope="module")
def straight(config, tmp_path_factory):
    """The uninterrupted run's outputs directory."""
    run = tmp_path_factory.mktemp("straight")
    assert train(config, run, STAGES) == 0
    return run


def assert_same_run(resumed, straight, agents=("a0", "a1"), stages=STAGES):
    """The same metrics (timings aside) and the same last weights, bit for bit."""
    assert [without_timings(m) for m in read_metrics(resumed)] == [
        without_timings(m) for m in read_metrics(straight)
    ]
    assert_same_weights(resumed, straight, agents, stages)


def assert_same_weights(resumed, straight, agents=("a0", "a1"), stages=STAGES):
    """The same last weights, bit for bit."""
    for agent in agents:
        last = f"agent_{agent}/stage_{stages - 1}/model.safetensors"
        expected, found = load_file(straight / last), load_file(resumed / last)
        assert expected.keys() == found.keys()
        assert all(torch.equal(expected[name], found[name]) for name in expected)


def test_the_in_process_runtime_trains_the_ray_runs_metrics_and_weights_bit_for_bit(
    straight_run, tmp_path
):
    """The shared Ray run (`satseq train`: a coordinator actor, a learner actor per agent, a
    rollout actor) and the same config trained here: what lets the fault tests compare their
    killed Ray runs with references trained in process (`in_process_run`)."""
    in_process = in_process_run(tmp_path, STRAIGHT_STAGES)
    assert_same_run(in_process, straight_run, ("a0", "a1", "a2"), STRAIGHT_STAGES)


def test_a_run_stopped_after_a_stage_resumes_to_the_uninterrupted_runs_metrics_and_weights(
    config, straight, tmp_path
):
    resumed = tmp_path / "resumed"
    assert train(config, resumed, 1) == 0  # stopped after stage 0's checkpoint
    assert train(config, resumed, STAGES, resume=True) == 1
    assert_same_run(resumed, straight)
    for run in (straight, resumed):  # keep_last 1: only the last stage's directories stay
        assert sorted(p.name for p in (run / "agent_a0").iterdir()) == [f"stage_{STAGES - 1}"]


def test_a_token_budget_ends_the_run_after_the_stage_that_spends_it(config, straight, tmp_path):
    """`trainer.max_generated_tokens` ends the run after the stage in which the generated tokens
    reach it: that stage is validated and saved as the last, a resume finds nothing left to
    train, and with the budget lifted the run trains on as the uninterrupted run did, bit for
    bit (the extra validation draws nothing from the training's random state)."""
    reference = [without_timings(m) for m in read_metrics(straight)]
    assert reference[1][RUN_TOKENS] == stage_tokens(reference[0]) + stage_tokens(reference[1])
    budget = reference[0][RUN_TOKENS] + 1  # spent during stage 1
    trainer = config.trainer.model_copy(update={"max_generated_tokens": budget})
    limited = config.model_copy(update={"trainer": trainer})
    run = tmp_path / "budget"
    assert train(limited, run, STAGES) == 0
    assert sorted(p.name for p in (run / "agent_a0").iterdir()) == ["stage_1"]  # the last one
    assert train(limited, run, STAGES, resume=True) == 2  # finished: no stage runs
    assert len(read_metrics(run)) == 2
    assert train(config, run, STAGES, resume=True) == 2  # the budget lifted
    metrics = [without_timings(m) for m in read_metrics(run)]
    validated = {key for key in metrics[1] if key.startswith("val/")}
    assert validated and not validated & set(reference[1])  # the straight run's stage 1: not
    metrics[1] = {key: value for key, value in metrics[1].items() if key not in validated}
    assert metrics == reference
    assert_same_weights(run, straight)


def test_an_agent_without_trajectories_in_a_stage_certifies_nothing_and_the_stage_runs(
    builtin_models, tmp_path
):
    """Three agents, one prompt a stage with 2 samples (agents a0 and a1): a2 has no training
    rows, so no epoch ran and its check measured nothing (the update's sequence KLs are None):
    its certified level is the bound on no prompts, 1, and the others' are below it."""
    model_path = load_config(QUICKSTART).team.agents[0].path
    agents = ", ".join(f"{{name: a{i}, path: '{model_path}'}}" for i in range(3))
    overrides = ["sat_seq.group_size=2", "trainer.batch_size=1", "trainer.stages=1"]
    config = short_run(f"team.agents=[{agents}]", *overrides)
    train(config, tmp_path, 1)
    (metrics,) = read_metrics(tmp_path)
    assert metrics["trust/certified_alpha/a2"] == 1.0
    assert metrics["trust/certified_alpha/a0"] < 1.0 and metrics["trust/certified_alpha/a1"] < 1.0


def test_a_run_ends_at_its_stages_or_when_its_tokens_reach_the_budget():
    trainer = TrainerConfig(stages=STAGES)
    assert not trainer.run_ends(2, 10**9) and trainer.run_ends(STAGES, 0)  # no budget
    budgeted = trainer.model_copy(update={"max_generated_tokens": 100})
    assert not budgeted.run_ends(1, 99) and budgeted.run_ends(1, 100)
    assert budgeted.run_ends(STAGES, 0)


@pytest.mark.parametrize("recipe", ["gae", "spo"])
def test_each_recipes_resume_state_brings_back_the_uninterrupted_run(
    builtin_models, tmp_path, recipe
):
    """GAE's resume state adds the value heads and their optimisers; SPO's, the trackers (with
    their stored log-probs and offline priors) and the sampler's RNG. Stopped after stage 1
    (SPO's trackers then hold both stages' prompts, which stage 2 draws again)."""
    if recipe == "gae":
        config = short_run("sat_seq.advantage=gae")
    else:  # the SPO run of `test_train_spo` (its own agents, 8 prompts, 6 with offline scores)
        config = short_run(*(arg for arg in spo_run_args(tmp_path) if arg != "--set"))
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(config, straight, STAGES)
    assert train(config, resumed, 2) == 0
    assert train(config, resumed, STAGES, resume=True) == 2
    assert_same_run(resumed, straight)
    reference = read_metrics(straight)
    # the runs learned something, so equality is not that of untouched weights
    assert any(m["accepted/a0"] > 0 or m["accepted/a1"] > 0 for m in reference)
    if recipe == "gae":  # the value heads learned, from V = 0 at the first stage
        assert reference[0]["value/mean/a0"] == 0.0
        assert all(m["value/loss/a0"] > 0 for m in reference)
        assert reference[-1]["value/mean/a0"] != 0.0


def test_a_run_resumes_from_its_s3_storage_after_losing_what_its_nodes_wrote(
    config, straight, tmp_path, s3_bucket
):
    """`output.storage` on a real S3 server: the learners' files, their saved stages and run.pt
    go there, and the stage logs; with the outputs dir gone (the nodes that wrote it lost), the
    resume downloads what it needs and ends as the uninterrupted run, its metrics included."""
    resumed = tmp_path / "resumed"
    stored = config.model_copy(
        update={"output": config.output.model_copy(update={"storage": s3_bucket("resume")})}
    )
    assert train(stored, resumed, 1) == 0
    storage = run_storage(resumed, stored.output.storage)
    assert storage.names(resumed / "checkpoints" / "stage_0") == [
        "learner_0.pt",
        "learner_1.pt",
        "run.pt",
    ]
    assert storage.names(resumed / "agent_a1") == ["stage_0"]
    assert {"metrics.jsonl", "certificates.jsonl"} <= set(storage.names(resumed))
    shutil.rmtree(resumed)  # its logs too: the driver's node lost as well
    assert train(stored, resumed, STAGES, resume=True) == 1
    assert_same_run(resumed, straight)
    assert storage.names(resumed / "agent_a0") == [f"stage_{STAGES - 1}"]  # keep_last there too
    assert storage.names(resumed / "checkpoints") == ["stage_1", "stage_2"]
