"""scripts/train_dapo.sh: the seeds' environment variables become `satseq train` overrides."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from satseq.config import ConfigError, load_config
from tests.cluster.runs import read_metrics, run_env
from tests.deploy.observed_run import REPO, SEEDS_ENV, STAGES, TRAIN_DAPO
from tests.deploy.satseq_cli import parse_satseq_command

SAT_SEQ_CONFIG = REPO / "configs" / "sat_seq.yaml"


def train_dapo(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    venv_bin = str(Path(sys.executable).parent)
    clean = {k: v for k, v in run_env().items() if not k.startswith("AGENT")}
    return subprocess.run(
        [str(TRAIN_DAPO), *args],
        env=clean | {"PATH": f"{venv_bin}:{os.environ['PATH']}"} | env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def dry_run(env: dict[str, str], *args: str):
    """The `satseq train` command the script would run, parsed by the real CLI."""
    result = train_dapo(env | {"DRY_RUN": "1"}, *args)
    assert result.returncode == 0, result.stderr
    name, params = parse_satseq_command(result.stdout)
    assert name == "satseq train"
    return params


def test_ppo_mini_batches_in_prompts_become_trajectories():
    """verl's ppo_mini_batch_size counts prompts, each with its group of responses; satseq's
    trainer.mini_batch_size counts trajectories: 16 prompts × sat_seq.group_size."""
    params = dry_run({"PPO_MINI_BATCH_SIZE": "16", "PPO_EPOCHS": "2"})
    config = load_config(params["config"], params["set_"])
    G = load_config(SAT_SEQ_CONFIG).sat_seq.group_size
    assert (config.trainer.mini_batch_size, config.trainer.ppo_epochs) == (16 * G, 2)


def test_the_group_size_is_the_runs_after_a_later_set():
    """A --set among the arguments wins over the file: 16 prompts × the run's G = 2."""
    params = dry_run({"PPO_MINI_BATCH_SIZE": "16"}, "--set", "sat_seq.group_size=2")
    config = load_config(params["config"], params["set_"])
    assert (config.sat_seq.group_size, config.trainer.mini_batch_size) == (2, 32)


def test_script_is_executable():
    assert os.access(TRAIN_DAPO, os.X_OK)


def test_seeds_variables_set_stages_batch_and_agent_models():
    params = dry_run(
        {
            "NUM_STAGES": "7",
            "TRAIN_BATCH_SIZE": "16",
            "AGENT1_PATH": "/models/first",
            "AGENT2_PATH": "/models/with space",
            "OUTPUT_DIR": "/runs/dapo",
        },
        "--resume",
    )
    assert params["config"] == SAT_SEQ_CONFIG
    assert params["output_dir"] == Path("/runs/dapo")
    assert params["resume"] is True
    config = load_config(params["config"], params["set_"])
    assert (config.trainer.stages, config.trainer.batch_size) == (7, 16)
    # AGENT3_PATH is unset: the third agent keeps the config's model
    assert [a.path for a in config.team.agents] == [
        "/models/first",
        "/models/with space",
        "Qwen/Qwen3-4B",
    ]


def test_without_variables_the_config_is_used_as_it_is():
    params = dry_run({})
    assert not params["set_"]
    assert load_config(params["config"], params["set_"]) == load_config(SAT_SEQ_CONFIG)


def test_agent_numbers_start_at_one():
    result = train_dapo({"AGENT0_PATH": "/models/x"})
    assert result.returncode == 2
    assert "AGENT0_PATH: agents are numbered from 1" in result.stderr


def test_an_agent_beyond_the_team_is_a_config_error_naming_the_override():
    params = dry_run({"AGENT4_PATH": "/models/x"})
    with pytest.raises(
        ConfigError, match=r"sat_seq\.agents\.3\.path=.*team\.agents\.3: index must be 0\.\.2"
    ):
        load_config(params["config"], params["set_"])  # what `satseq train` does first


@pytest.mark.slow
def test_a_real_tiny_run_through_the_script(observed_run):
    """The observe tests' run was started by train_dapo.sh with the seeds' variables."""
    config = load_config(observed_run.output_dir / "train_config.yaml")
    assert config.trainer.stages == int(SEEDS_ENV["NUM_STAGES"]) == STAGES
    assert config.trainer.batch_size == int(SEEDS_ENV["TRAIN_BATCH_SIZE"])
    assert [a.path for a in config.team.agents] == ["builtin:tiny"] * 3
    assert [m["stage"] for m in read_metrics(observed_run.output_dir)] == list(range(STAGES))
    for agent in config.team.agents:
        assert (observed_run.output_dir / f"agent_{agent.name}" / f"stage_{STAGES - 1}").is_dir()
