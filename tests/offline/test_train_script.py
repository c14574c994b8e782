"""`scripts/train.sh`: the seeds' environment variables become `satseq train` overrides."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from satseq.data import make_split, write_subsets

ROOT = Path(__file__).parents[2]
TRAIN_SH = ROOT / "scripts" / "train.sh"
SATSEQ = str(Path(sys.executable).parent / "satseq")
# The script reads these; the test's environment must not leak any of them into a run.
SCRIPT_VARIABLES = (
    "METHOD", "OUTPUT_DIR", "TRAIN_DATA_DIR", "MODEL_PATH", "EXP_NAME", "OFFLINE_VALUES",
    "N_TRAIN", "N_VAL", "RESPONSE_LENGTH", "DEBUG", "DRY_RUN", "RAY_ADDRESS",
    "PPO_MINI_BATCH_SIZE", "PPO_EPOCHS",
)  # fmt: skip


def run_script(variables, *args, timeout=60):
    env = {k: v for k, v in os.environ.items() if k not in SCRIPT_VARIABLES}
    env |= {"SATSEQ": SATSEQ, **variables}
    return subprocess.run(
        [str(TRAIN_SH), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def printed_command(result):
    """The command the script prints on its first line ("+ satseq train ...")."""
    assert result.returncode == 0, result.stderr
    first_line = result.stdout.splitlines()[0]
    assert first_line.startswith("+ ")
    return shlex.split(first_line[2:])


def resolved_config(command):
    """What `satseq train` would train with: the same arguments given to `config show`."""
    assert command[:2] == [SATSEQ, "train"]
    show = subprocess.run(
        [SATSEQ, "config", "show", *command[2:]], capture_output=True, text=True, timeout=60
    )
    assert show.returncode == 0, show.stderr
    return yaml.safe_load(show.stdout)


def test_spo_variables_map_to_config_keys(tmp_path):
    result = run_script(
        {
            "METHOD": "SPO",
            "DRY_RUN": "1",
            "OUTPUT_DIR": str(tmp_path / "runs"),
            "EXP_NAME": "0123",  # stays text, not the number 123
            "TRAIN_DATA_DIR": "splits/train set.parquet",
            "MODEL_PATH": "/models/it's here",
            "OFFLINE_VALUES": "splits/offline_values.json",
            "RESPONSE_LENGTH": "2048",
            "N_TRAIN": "4",
            "N_VAL": "16",
        },
        "--resume",
    )
    command = printed_command(result)
    assert command[2] == str(ROOT / "configs" / "spo.yaml")
    assert command[-1] == "--resume"
    assert len(result.stdout.splitlines()) == 1  # DRY_RUN: printed, not run
    assert "N_TRAIN=4 is not used: SPO samples one response per prompt" in result.stderr
    config = resolved_config(command[:-1])
    assert config["algorithm"]["name"] == "spo"
    output = config["output"]
    assert (output["dir"], output["exp_name"], output["trackers"]) == (
        str(tmp_path / "runs"),
        "0123",
        ["tensorboard"],
    )
    assert config["data"]["train"] == "splits/train set.parquet"
    assert config["team"]["agents"][0]["path"] == "/models/it's here"
    assert config["spo"]["offline_values"] == "splits/offline_values.json"
    assert config["rollout"]["max_new_tokens"] == 2048
    assert config["eval"]["samples_per_agent"] == 16  # N_VAL: samples per validation prompt
    assert config["grpo"]["group_size"] == 8  # untouched: SPO does not read it


@pytest.mark.parametrize(
    ("variables", "trajectories"),
    [
        ({"METHOD": "GRPO", "N_TRAIN": "8"}, 16 * 8),  # the seeds' GRPO: 16 prompts × n 8
        ({"METHOD": "GRPO"}, 16 * 8),  # configs/grpo.yaml's group_size: 8
        ({"METHOD": "GRPO", "N_TRAIN": "4"}, 16 * 4),
        ({"METHOD": "SPO"}, 16),  # one response per prompt
        ({"METHOD": "GRPO", "ARGS": "--set grpo.group_size=2"}, 16 * 2),  # a later --set wins
        ({"METHOD": "GRPO", "ARGS": "--set=grpo.group_size=2"}, 16 * 2),
    ],
)
def test_ppo_mini_batches_in_prompts_become_trajectories(variables, trajectories):
    """verl counts ppo_mini_batch_size in prompts, each with its responses; satseq's
    trainer.mini_batch_size counts trajectories, with the run's group size."""
    variables = dict(variables)
    args = variables.pop("ARGS", "").split()
    command = printed_command(
        run_script(
            variables | {"PPO_MINI_BATCH_SIZE": "16", "PPO_EPOCHS": "2", "DRY_RUN": "1"}, *args
        )
    )
    trainer = resolved_config(command)["trainer"]
    assert (trainer["mini_batch_size"], trainer["ppo_epochs"]) == (trajectories, 2)


def test_grpo_is_the_seeds_default_and_n_train_is_its_group_size():
    result = run_script({"DRY_RUN": "True", "N_TRAIN": "4", "OFFLINE_VALUES": "v.json"})
    command = printed_command(result)
    assert command[:3] == [SATSEQ, "train", str(ROOT / "configs" / "grpo.yaml")]
    assert "OFFLINE_VALUES is not used: only SPO reads it" in result.stderr
    config = resolved_config(command)
    assert config["algorithm"]["name"] == "grpo"
    assert config["grpo"]["group_size"] == 4
    assert config["spo"]["offline_values"] is None


def test_debug_is_a_tiny_cpu_run_that_the_variables_still_override():
    result = run_script({"METHOD": "spo", "DEBUG": "1", "DRY_RUN": "1", "RESPONSE_LENGTH": "40"})
    config = resolved_config(printed_command(result))
    [agent] = config["team"]["agents"]
    assert (agent["name"], agent["path"], agent["lora"]) == ("policy", "builtin:tiny", None)
    assert config["data"]["train"] == "synthetic"
    assert (config["rollout"]["engine"], config["rollout"]["max_new_tokens"]) == ("hf", 40)
    assert (config["trainer"]["stages"], config["trainer"]["batch_size"]) == (2, 4)
    assert config["trainer"]["resources"]["num_gpus"] == 0
    assert config["output"]["exp_name"] == "debug_spo"


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"METHOD": "PPO"}, "METHOD=PPO: use GRPO or SPO"),
        ({"DEBUG": "maybe"}, "DEBUG=maybe: use 1/True or 0/False"),
    ],
)
def test_bad_variables_are_named(variables, message):
    result = run_script({"DRY_RUN": "1", **variables})
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""


@pytest.mark.slow
def test_spo_debug_run_trains_end_to_end_on_a_directory_of_subsets(tmp_path):
    # the seeds' TRAIN_DATA_DIR: the subset_<i>.parquet files that `offline-values split` wrote
    problems = make_split("test", 16, seed=0, difficulty=1, style="symbols")
    write_subsets(problems, tmp_path / "splits", num_subsets=2)
    variables = {"METHOD": "SPO", "DEBUG": "1", "OUTPUT_DIR": str(tmp_path)}
    result = run_script(variables | {"TRAIN_DATA_DIR": str(tmp_path / "splits")}, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    run_dir = tmp_path / "debug_spo"
    config = yaml.safe_load((run_dir / "train_config.yaml").read_text())
    assert config["algorithm"]["name"] == "spo"
    assert config["data"]["train"] == str(tmp_path / "splits")
    stages = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(stages) == 2
    assert (run_dir / "agent_policy" / "stage_1" / "config.json").is_file()
