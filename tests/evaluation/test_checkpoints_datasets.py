"""Which team and which problems `satseq eval` takes: checkpoint layouts and dataset names."""

import json

import pytest

from satseq.config import load_config
from satseq.data import DataError, make_split
from satseq.evaluation import CheckpointError, resolve_dataset, resolve_team
from satseq.evaluation.datasets import HUB_DATASETS
from tests.evaluation.conftest import copy_team


def test_a_training_output_dir_gives_each_agents_latest_stage(training_output_dir):
    team = resolve_team(training_output_dir)
    assert team.agent_names == ["a0", "a1", "a2"]
    assert team.stages == {"a0": 2, "a1": 2, "a2": 2}
    assert team.agent_paths["a1"] == training_output_dir / "agent_a1" / "stage_2"


def test_stage_picks_another_stage_and_a_missing_one_lists_the_saved(training_output_dir):
    assert set(resolve_team(training_output_dir, stage=0).stages.values()) == {0}
    with pytest.raises(CheckpointError, match=r"no stage 1; saved stages are \[0, 2\]"):
        resolve_team(training_output_dir, stage=1)


def test_a_dir_of_per_agent_model_dirs(tmp_path):
    team = resolve_team(copy_team(tmp_path, "per_agent"))
    assert team.agent_paths == {name: tmp_path / name for name in ("a0", "a1", "a2")}
    assert team.stages == {"a0": None, "a1": None, "a2": None}
    with pytest.raises(CheckpointError, match="no stages"):
        resolve_team(tmp_path, stage=0)


def test_a_dir_without_a_team_says_what_was_expected(tmp_path):
    with pytest.raises(CheckpointError, match=r"agent_<name>/stage_<k>/"):
        resolve_team(tmp_path)
    (tmp_path / "agent_x" / "stage_0").mkdir(parents=True)  # a save cut short: no config.json
    with pytest.raises(CheckpointError, match="agent_x: no saved stage"):
        resolve_team(tmp_path)
    with pytest.raises(CheckpointError, match="not a directory"):
        resolve_team(tmp_path / "missing")


def test_synthetic_test_is_held_out_of_the_quickstarts_training_and_warm_start():
    config = load_config()  # the quickstart: trains on split "train", evaluates on "test"
    s = config.data.synthetic
    trained = make_split(s.split, s.n_train, seed=s.seed, difficulty=s.difficulty, style=s.style)
    held_out = resolve_dataset("synthetic:test", config)
    n = config.eval.synthetic_problems
    assert s.split == "train" and len(held_out) == n > 0
    assert held_out == make_split("test", n, seed=s.seed, difficulty=s.difficulty, style=s.style)
    warm_start = make_split("warmup", 2000, seed=0, difficulty=s.difficulty)
    held_out_expressions = {p.meta["expression"] for p in held_out}
    assert held_out_expressions.isdisjoint(p.meta["expression"] for p in trained)
    assert held_out_expressions.isdisjoint(p.meta["expression"] for p in warm_start)


def test_synthetic_after_training_on_the_same_split_skips_what_training_used():
    config = load_config(overrides=["data.synthetic.split=test", "data.synthetic.n_train=48"])
    s = config.data.synthetic
    trained = make_split("test", 48, seed=s.seed, difficulty=s.difficulty, style=s.style)
    held_out = resolve_dataset("synthetic:test", config)
    # make_split is prefix-stable, so the held-out problems are the ones right after training's
    longer = make_split(
        "test", 48 + len(held_out), seed=s.seed, difficulty=s.difficulty, style=s.style
    )
    assert longer[:48] == trained and longer[48:] == held_out


def test_synthetic_beyond_the_split_says_which_key_to_lower():
    config = load_config(overrides=["eval.synthetic_problems=5000"])
    with pytest.raises(DataError, match=r"eval\.synthetic_problems"):
        resolve_dataset("synthetic:test", config)


def test_a_local_jsonl_in_any_detected_format(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"problem": "Compute 1 + 1.", "answer": "2"}, {"prompt": "2+2?", "chosen": "4"}]
    path.write_text(json.dumps(rows[0]) + "\n")
    assert [p.answer for p in resolve_dataset(str(path), load_config())] == ["2"]
    path.write_text(json.dumps(rows[1]) + "\n")
    assert [p.answer for p in resolve_dataset(str(path), load_config())] == ["4"]


@pytest.mark.parametrize("alias", sorted(HUB_DATASETS))
def test_a_hub_name_offline_says_how_to_pass_a_local_file(alias, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # `datasets` and the Hub client read those once, at import: after an earlier test of the
    # worker imported them, only their constants make the Hub offline (else: 23 s of retries
    # against the network this machine lacks)
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(DataError) as error:
        resolve_dataset(alias, load_config())
    message = str(error.value)
    assert HUB_DATASETS[alias].name in message
    assert f"--dataset {alias}.jsonl" in message and "to_json" in message


def test_eval_rollout_cpus_sizes_the_evaluations_rollout_actors_and_their_engine_threads():
    """Training's rollout actors share the machine with learners; an evaluation's need not."""
    from satseq.config import QUICKSTART
    from satseq.evaluation.runner import evaluation_config
    from satseq.launch.settings import engine_options

    trained = load_config(QUICKSTART, ["rollout.resources.num_cpus=1"])
    assert evaluation_config(trained) is trained  # eval.rollout_cpus unset: as trained
    config = load_config(QUICKSTART, ["rollout.resources.num_cpus=1", "eval.rollout_cpus=2"])
    evaluated = evaluation_config(config)
    assert evaluated.rollout.resources.num_cpus == 2.0
    assert engine_options(evaluated)["num_threads"] == 2
    assert engine_options(config)["num_threads"] == 1  # training's own stays as it was
    with pytest.raises(ValueError, match=r"eval\.rollout_cpus"):
        load_config(QUICKSTART, ["eval.rollout_cpus=0"])
