"""Config loading: files, overrides, seeds' keys, and errors that name the key path."""

import re
import warnings
from pathlib import Path

import pytest
import yaml

from satseq.cluster.learner_specs import learner_spec
from satseq.cluster.recipes.sat_seq import SatSeqRecipe
from satseq.config import (
    CONFIG_DIR,
    QUICKSTART,
    TRAIN_CONFIG,
    ConfigError,
    apply_override,
    dump_config,
    load_config,
    run_config_for,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


MINIMAL = "team:\n  agents:\n    - {name: a, path: /models/a}\n"


def test_every_shipped_config_validates():
    paths = sorted(CONFIG_DIR.glob("*.yaml"))
    assert {p.name for p in paths} >= {"quickstart.yaml", "sat_seq.yaml", "spo.yaml", "grpo.yaml"}
    for path in paths:
        if "applications" in yaml.safe_load(path.read_text()):  # a Ray Serve config: tests/serving
            continue
        load_config(path)


def test_default_is_quickstart_with_three_agents():
    config = load_config()
    assert [a.name for a in config.team.agents] == ["a0", "a1", "a2"]
    assert config.algorithm.name == "sat_seq"


def test_seeds_keys_are_accepted_as_they_are(tmp_path):
    config = load_config(
        write(
            tmp_path,
            """
algorithm:
  gamma: 0.9
  lam: 0.8
  kl_ctrl: {kl_coef: 0.02, target_kl: 0.1, quantile: 0.95}
sat_seq:
  epsilon: 0.3
  A_clip: 3
  group_size: 4
  max_backtracks: 5
  agents:
    - {name: x, path: /m/x}
    - {name: y, path: /m/y}
""",
        )
    )
    assert config.algorithm.gamma == 0.9 and config.algorithm.lam == 0.8
    assert config.algorithm.kl_ctrl.quantile == 0.95 and config.algorithm.kl_ctrl.kl_coef == 0.02
    assert (config.sat_seq.epsilon, config.sat_seq.A_clip) == (0.3, 3.0)
    assert (config.sat_seq.group_size, config.algorithm.kl_ctrl.max_backtracks) == (4, 5)
    assert [a.name for a in config.team.agents] == ["x", "y"]  # sat_seq.agents is the team


def test_two_different_agent_lists_are_an_error(tmp_path):
    text = MINIMAL + "sat_seq:\n  agents: [{name: b, path: /m/b}]\n"
    with pytest.raises(ConfigError, match=r"sat_seq\.agents .* and team\.agents disagree"):
        load_config(write(tmp_path, text))


def test_overrides_apply_in_order_and_parse_yaml_values(tmp_path):
    config = load_config(
        write(tmp_path, MINIMAL),
        [
            "trainer.stages=3",
            "trainer.stages=4",
            "rollout.tools.enabled=true",
            "team.agents.0.path=/elsewhere",
            "reward.fallbacks=[answer_is, last_number]",
            "data.field_map={problem: question}",
        ],
    )
    assert config.trainer.stages == 4
    assert config.rollout.tools.enabled is True
    assert config.team.agents[0].path == "/elsewhere"
    assert config.reward.fallbacks == ["answer_is", "last_number"]
    assert config.data.field_map == {"problem": "question"}


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("algorithm.kl_ctrl.target_kl=abc", "algorithm.kl_ctrl.target_kl"),
        ("sat_seq.epsilonn=0.1", "sat_seq.epsilonn: unknown key"),
        ("trainer.batch_size=0", "trainer.batch_size"),
        ("algorithm.name=ppo", "algorithm.name"),
        ("rollout.engine=tensorrt", "rollout.engine"),
        ("spo.rho_min=0.99", "rho_min"),
        ("trainer.offload=bogus", "trainer.offload"),
        ("team.agents.0.offload=always", "team.agents.0.offload"),
    ],
)
def test_bad_values_name_the_key_path(tmp_path, override, named):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, MINIMAL), [override])
    assert named in str(err.value)
    assert "run.yaml" in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["rollout.weight_sync=collective"], "needs rollout.engine: vllm"),
        (
            [
                "rollout.weight_sync=collective",
                "rollout.engine=vllm",
                "trainer.offload=idle_agents",
            ],
            "engines that stay awake",
        ),
        (["rollout.weight_sync=nccl"], "rollout.weight_sync"),
    ],
)
def test_a_collective_weight_sync_names_what_it_needs(tmp_path, overrides, named):
    with pytest.raises(ConfigError, match=named):
        load_config(write(tmp_path, MINIMAL), overrides)


def test_an_agent_overrides_the_trainers_offload(tmp_path):
    team = MINIMAL + "    - {name: b, path: /models/b, offload: none}\n"
    config = load_config(write(tmp_path, team), ["trainer.offload=idle_agents"])
    settings = SatSeqRecipe.learner_settings(config)
    specs = [learner_spec(config, i, settings, "cpu", 1) for i in range(2)]
    assert [spec.offload for spec in specs] == ["idle_agents", "none"]
    assert learner_spec(load_config(write(tmp_path, team)), 0, settings, "cpu", 1).offload == "none"


def test_unknown_section_in_file_names_it(tmp_path):
    with pytest.raises(ConfigError, match="trainerr: unknown key"):
        load_config(write(tmp_path, MINIMAL + "trainerr: {stages: 2}\n"))


def test_file_problems_are_reported_with_the_path(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "team: [unclosed\n"))
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match=r"team\.agents is empty"):
        load_config(write(tmp_path, "trainer: {stages: 2}\n"))


def test_malformed_overrides():
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        apply_override({}, "trainer.stages")
    with pytest.raises(ConfigError, match="is a value, not a section"):
        apply_override({"trainer": {"stages": 2}}, "trainer.stages.x=1")
    with pytest.raises(ConfigError, match=r"index must be 0\.\.0"):
        apply_override({"team": {"agents": [{"name": "a"}]}}, "team.agents.3.path=x")


def test_dump_round_trips(tmp_path):
    config = load_config(write(tmp_path, MINIMAL), ["sat_seq.epsilon=0.15"])
    dumped = tmp_path / "resolved.yaml"
    dumped.write_text(dump_config(config))
    assert load_config(dumped) == config
    assert "agents" not in yaml.safe_load(dumped.read_text())["sat_seq"]


def test_one_spelling_reaches_the_team_whatever_the_file_used(tmp_path):
    """configs/sat_seq.yaml spells the team as the seeds do (sat_seq.agents): an override under
    either name reaches the same list (docs/getting-started.md's --set team.agents.0.path)."""
    seeds = Path("configs/sat_seq.yaml")
    for key in ("team.agents.0.path", "sat_seq.agents.0.path"):
        config = load_config(seeds, [f"{key}=/models/mine"])
        assert config.team.agents[0].path == "/models/mine"
        assert [a.name for a in config.team.agents] == ["solver_a", "solver_b", "solver_c"]
    config = load_config(seeds, ["sat_seq.max_backtracks=7"])
    assert config.algorithm.kl_ctrl.max_backtracks == 7


def test_old_spellings_warn_once_and_mean_todays_key(tmp_path):
    old = MINIMAL + "trainer: {update_steps: 3}\nalgorithm: {kl_ctrl: {dkw_eta: 0.1}}\n"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own filter for a FutureWarning
        config = load_config(write(tmp_path, old))
        load_config(write(tmp_path, old))  # the second time: no warning
    assert sorted(str(w.message).split()[0] for w in caught) == [
        "algorithm.kl_ctrl.dkw_eta",
        "trainer.update_steps",
    ]
    assert (config.trainer.ppo_epochs, config.algorithm.kl_ctrl.eta) == (3, 0.1)
    with pytest.raises(ConfigError, match=r"trainer\.update_steps .* and trainer\.ppo_epochs"):
        load_config(write(tmp_path, MINIMAL + "trainer: {update_steps: 3, ppo_epochs: 2}\n"))


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("team.topology=chain", "team.topology: chain"),
        ("team.agents.0.role_prompt=x", "role_prompt"),
    ],
)
def test_grpo_and_spo_refuse_the_chains_keys_naming_them(override, named):
    for algorithm in ("grpo", "spo"):
        with pytest.raises(ConfigError, match=named):
            load_config(QUICKSTART, [f"algorithm.name={algorithm}", override])
    load_config(QUICKSTART, [override])  # SAT-Seq reads them


def test_verls_train_files_is_data_train(tmp_path):
    files = "data:\n  train_files: [a.parquet, b.parquet]\n"
    config = load_config(write(tmp_path, MINIMAL + files))
    assert config.data.train == ["a.parquet", "b.parquet"]
    assert "train_files" not in yaml.safe_load(dump_config(config))["data"]
    with pytest.raises(ConfigError, match=r"data\.train_files .* and data\.train disagree"):
        load_config(write(tmp_path, MINIMAL + files + "  train: c.parquet\n"))


def test_an_override_under_either_name_replaces_the_files_data_train(tmp_path):
    quickstart_style = write(tmp_path, MINIMAL + "data: {train: synthetic}\n")
    config = load_config(quickstart_style, ["data.train_files=[a.parquet]"])
    assert config.data.train == ["a.parquet"]
    verl_style = write(tmp_path, MINIMAL + "data: {train_files: [a.parquet]}\n")
    assert load_config(verl_style, ["data.train=b.parquet"]).data.train == "b.parquet"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("data.train=[]", "data.train: Value error, an empty list"),
        ("data.train=[synthetic, a.jsonl]", "data.train: Value error, 'synthetic' is the built-in"),
        ("data.train=[a.jsonl", "the value of data.train is not valid YAML"),
    ],
)
def test_bad_training_sources_name_the_key(tmp_path, override, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_config(write(tmp_path, MINIMAL), [override])


def test_the_synthetic_difficulty_is_a_level_or_a_task_name(tmp_path):
    config = load_config(write(tmp_path, MINIMAL), ["data.synthetic.difficulty=levels_1_to_3"])
    assert config.data.synthetic.difficulty == "levels_1_to_3"
    unknown = r"data\.synthetic\.difficulty: Value error, unknown difficulty level 'levels_1_to_4'"
    with pytest.raises(ConfigError, match=unknown):
        load_config(write(tmp_path, MINIMAL), ["data.synthetic.difficulty=levels_1_to_4"])


def trained_team(tmp_path: Path, text: str) -> Path:
    """A checkpoint dir holding the train_config.yaml a run of `text` writes."""
    (tmp_path / "team").mkdir()
    resolved = dump_config(load_config(write(tmp_path, text)))
    (tmp_path / "team" / TRAIN_CONFIG).write_text(resolved)
    return tmp_path / "team"


def test_a_trained_team_is_served_at_its_trained_budget(tmp_path):
    team = trained_team(tmp_path, MINIMAL + "rollout: {max_new_tokens: 4096}\n")
    assert run_config_for(team, []).serve.max_tokens == 4096
    assert run_config_for(team, ["serve.max_tokens=32"]).serve.max_tokens == 32
    assert run_config_for(tmp_path / "no_config", []).serve.max_tokens == 256  # no trained budget


def test_a_serve_budget_chosen_in_training_is_kept(tmp_path):
    text = MINIMAL + "rollout: {max_new_tokens: 4096}\nserve: {max_tokens: 1024}\n"
    assert run_config_for(trained_team(tmp_path, text), []).serve.max_tokens == 1024


def test_weighted_reward_functions_are_read_and_one_way_to_name_them(tmp_path):
    config = load_config(
        write(tmp_path, MINIMAL),
        ["reward.functions=[{function: verify, weight: 2}, {function: 'my.pkg:length'}]"],
    )
    assert [(f.function, f.weight) for f in config.reward.functions] == [
        ("verify", 2.0),
        ("my.pkg:length", 1.0),
    ]
    with pytest.raises(ConfigError, match=r"reward\.function and reward\.functions"):
        load_config(
            write(tmp_path, MINIMAL),
            ["reward.function=my.pkg:score", "reward.functions=[{function: verify}]"],
        )
    with pytest.raises(ConfigError, match=r"reward\.functions\.0\.weight"):
        load_config(write(tmp_path, MINIMAL), ["reward.functions=[{function: verify, weight: x}]"])
