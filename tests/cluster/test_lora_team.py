"""A LoRA team on the in-process runtime (design §12): a team that mixes LoRA and full agents
trains, its LoRA agents on one engine that holds each learner's adapter after its push; a LoRA
agent is swapped for a full model and back to an adapter with the Stage-0 projection; and every
bad LoRA input is a config error naming the key and the value."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from satseq.actors.engines.lora import LoraAgentEngine
from satseq.cluster.recipes import RECIPES
from satseq.cluster.recipes.base import stage_sampling_spec
from satseq.cluster.swap import swap_agent
from satseq.cluster.team import start_in_process
from satseq.cluster.training_data import training_problems
from satseq.config import QUICKSTART, load_config
from satseq.config.load import ConfigError
from satseq.config.team import SwapConfig
from satseq.launch.agent_models import agent_model_dirs
from satseq.models import is_adapter_dir, load_tokenizer, resolve_model_path
from tests.cluster.test_recipe_wiring import one_stage

SATSEQ = str(Path(sys.executable).parent / "satseq")


def assert_engines_score_as_the_learners(runtime, batch):
    """Each agent's engine gives its learner's log-probs of `batch` (its push arrived)."""
    (worker,) = runtime.team.rollouts
    sequences = [t.prompt_ids + t.response_ids for t in batch]
    starts = [len(t.prompt_ids) for t in batch]
    for name, learner in zip(runtime.team.agents, runtime.team.learners, strict=True):
        expected = learner.logprobs(batch)
        scored = worker.engines[name].prompt_logprobs(sequences, starts)
        for row, values in enumerate(scored):
            assert values == pytest.approx(expected[row, : len(values)].tolist(), abs=1e-4), name


@pytest.fixture(scope="module")
def quickstart_model(builtin_models):
    return load_config(QUICKSTART).team.agents[0].path


def test_a_team_of_lora_and_full_agents_trains_and_its_engines_hold_every_push(quickstart_model):
    runtime, _, result = one_stage(
        quickstart_model, "sat_seq", 3, "trainer.lora.rank=8", "team.agents.2.lora=false"
    )
    assert [is_adapter_dir(d) for d in runtime.team.model_dirs] == [True, True, False]
    (worker,) = runtime.team.rollouts
    assert worker.engines["a0"].shared is worker.engines["a1"].shared  # one engine, one base
    assert not isinstance(worker.engines["a2"], LoraAgentEngine)
    assert sorted(args[0] for _, args, _ in runtime.called("update")) == [0, 1, 2]
    assert all(result.metrics[f"accepted/{name}"] == 1 for name in runtime.team.agents)
    adapter = runtime.team.learners[0].weights()
    assert all(".lora_" in name for name in adapter)
    full = runtime.team.learners[2].weights()  # a full model: every weight
    assert not any(".lora_" in name for name in full)
    assert sum(t.numel() for t in full.values()) > sum(t.numel() for t in adapter.values())
    (_, (stage_batch, *_), _) = runtime.called("logprobs")[0]
    assert_engines_score_as_the_learners(runtime.runtime, stage_batch.trajectories[:6])


def test_a_lora_agent_swaps_to_a_full_model_and_back_to_an_adapter(quickstart_model, tmp_path):
    config = load_config(
        QUICKSTART,
        [
            f"team.agents=[{{name: a0, path: '{quickstart_model}'}}, "
            f"{{name: a1, path: '{quickstart_model}'}}]",
            "trainer.lora.rank=8",
            "trainer.batch_size=2",
            "rollout.max_new_tokens=16",
        ],
    )
    runtime = start_in_process(config, RECIPES["sat_seq"].learner_settings(config))
    problems = training_problems(config)[:2]
    a0_adapter = runtime.team.learners[0].save_pretrained(str(tmp_path / "a0_adapter"))
    full = str(resolve_model_path(quickstart_model))
    (worker,) = runtime.team.rollouts
    for path, lora in ((full, False), (a0_adapter, True)):
        swap = SwapConfig(
            agent="a1", path=path, at_stage=0, delta0=10.0, max_steps=2, samples_per_prompt=1
        )
        metrics = swap_agent(runtime, config, swap, problems, 0, tmp_path / "swaps")
        assert metrics["swap/a1/swapped"] == 1 and metrics["swap/a1/budget_met"] == 1
        assert runtime.team.agent_paths[1] == path
        assert is_adapter_dir(runtime.team.model_dirs[1]) == lora
        assert isinstance(worker.engines["a1"], LoraAgentEngine) == lora
        assert all((".lora_" in name) == lora for name in runtime.team.learners[1].weights())
    assert worker.engines["a1"].shared is worker.engines["a0"].shared  # back on the one engine
    samples = runtime.sample(problems, [[1]], stage_sampling_spec(config, 0))
    assert_engines_score_as_the_learners(runtime, samples)


# --- bad input: config errors naming the key and the value -------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.lora.rank=0"], r"trainer.lora.rank: .*greater than 0 \(got 0\)"),
        (["team.agents.1.lora.rank=-2"], r"team.agents.1.lora.rank: .*\(got -2\)"),
        (
            ["trainer.lora.rank=8", "trainer.workers_per_agent=2"],
            r"trainer.workers_per_agent: 2 with trainer.lora",
        ),
        (
            ["trainer.lora.rank=8", "team.agents.0.path=/models/smol.Q4_1.gguf"],
            r"team.agents.0.path: '/models/smol.Q4_1.gguf' is a GGUF file that has not been "
            r"imported.*'gguf:/models/smol.Q4_1.gguf'",
        ),
    ],
)
def test_a_bad_lora_config_names_the_key_and_the_value(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(QUICKSTART, overrides)


def test_an_unknown_target_module_stops_satseq_train_before_ray_naming_key_and_value(
    raw_tiny_model,
):
    agents = f"[{{name: a0, path: '{raw_tiny_model}'}}]"
    modules = "trainer.lora={rank: 4, target_modules: [q_proj, qkv]}"
    result = subprocess.run(
        [SATSEQ, "train", "--set", f"team.agents={agents}", "--set", modules],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "trainer.lora.target_modules: ['q_proj', 'qkv']" in result.stderr
    assert "no linear layers named ['qkv']" in result.stderr
    assert "Ray" not in result.stdout + result.stderr  # no cluster was started


def test_lora_agents_on_bases_with_different_tokenizers_are_refused(raw_tiny_model, tmp_path):
    other = tmp_path / "other_base"
    shutil.copytree(raw_tiny_model, other)
    tokenizer = load_tokenizer(other)
    tokenizer.add_tokens(["<another-token>"])
    tokenizer.save_pretrained(other)
    agents = f"[{{name: a0, path: '{raw_tiny_model}'}}, {{name: a1, path: '{other}'}}]"
    config = load_config(QUICKSTART, [f"team.agents={agents}", "trainer.lora.rank=4"])
    with pytest.raises(ValueError, match=f"team.agents.1.path: '{other}' has another tokenizer"):
        agent_model_dirs(config)
