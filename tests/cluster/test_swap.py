"""Swapping an agent in mid-training (`team.swaps`) on the in-process runtime: after stage 0, agent
a1's learner is replaced by one on another model, projected towards a1's outgoing policy; a
projection that misses δ0 leaves a1 as it was and is tried again at the next stage."""

import pytest
import torch

from satseq.actors.learner.handle import LearnerHandle
from satseq.cluster.recipes import RECIPES
from satseq.cluster.swap import apply_swaps, check_same_tokenizer
from satseq.cluster.team import start_in_process
from satseq.cluster.training_data import training_problems
from satseq.config import QUICKSTART, load_config
from satseq.models import load_tokenizer, resolve_model_path


def swap_config(incoming: str, delta0: float, max_steps: int, on_budget_missed: str = "retry"):
    agents = ", ".join(f"{{name: a{i}, path: 'builtin:tiny'}}" for i in range(2))
    swap = f"{{agent: a1, path: '{incoming}', at_stage: 1, delta0: {delta0}"
    swap += f", max_steps: {max_steps}, lr: 3.0e-3, samples_per_prompt: 1"
    swap += f", on_budget_missed: {on_budget_missed}}}"
    return load_config(
        QUICKSTART,
        [
            f"team.agents=[{agents}]",
            f"team.swaps=[{swap}]",
            "trainer.batch_size=4",
            "sat_seq.group_size=2",
            "rollout.max_new_tokens=16",
            "trainer.ppo_epochs=1",
            "data.synthetic.n_train=8",
        ],
    )


def run_with_swap(incoming: str, delta0: float, max_steps: int, swap_dir, **swap):
    config = swap_config(incoming, delta0, max_steps, **swap)
    recipe_class = RECIPES["sat_seq"]
    runtime = start_in_process(config, recipe_class.learner_settings(config))
    problems = training_problems(config)
    recipe = recipe_class(config, runtime, problems)
    recipe.run_stage(0)
    outgoing = runtime.team.learners[1]
    assert apply_swaps(runtime, config, recipe, 0, swap_dir) == {}  # none due before stage 0
    metrics = apply_swaps(runtime, config, recipe, 1, swap_dir)
    return config, runtime, recipe, outgoing, metrics


def assert_engine_holds_learner_weights(runtime, i):
    (worker,) = runtime.team.rollouts
    engine_weights = worker.engines[runtime.team.agents[i]].model.state_dict()
    for key, tensor in runtime.team.learners[i].weights().items():
        assert torch.equal(engine_weights[key], tensor), f"{key} was not pushed"


def test_swap_at_stage_1_replaces_the_learner_and_meets_delta0(raw_tiny_model, tmp_path):
    delta0 = 0.5
    config, runtime, recipe, outgoing, metrics = run_with_swap(
        raw_tiny_model, delta0, 200, tmp_path
    )
    incoming = runtime.team.learners[1]
    assert incoming is not outgoing and runtime.team.learners[0] is not incoming
    assert isinstance(outgoing, LearnerHandle) and isinstance(incoming, LearnerHandle)
    assert incoming.spec.model_path == raw_tiny_model
    assert runtime.team.agent_paths == ["builtin:tiny", raw_tiny_model]
    assert incoming.region.beta == config.algorithm.kl_ctrl.kl_coef  # β reset to the config's
    assert not incoming.policy.optimizer.state  # its training optimiser is fresh
    # the raw model is far from the warm-started a1: the projection had to act
    assert metrics["swap/a1/kl_before"] > delta0
    assert metrics["swap/a1/lambda"] > 0
    assert 1 <= metrics["swap/a1/steps"] < 200
    assert metrics["swap/a1/kl"] <= delta0 and metrics["swap/a1/budget_met"] == 1
    assert metrics["swap/a1/swapped"] == 1
    assert_engine_holds_learner_weights(runtime, 1)
    assert apply_swaps(runtime, config, recipe, 2, tmp_path) == {}  # done: not due again
    result = recipe.run_stage(1)  # the stage runs on with the swapped-in agent
    assert result.metrics["accepted/a1"] + result.metrics["rejected/a1"] == 1


def test_a_missed_budget_keeps_the_outgoing_agent_and_retries_at_the_next_stage(
    raw_tiny_model, tmp_path
):
    config, runtime, recipe, outgoing, metrics = run_with_swap(raw_tiny_model, 0.5, 3, tmp_path)
    assert metrics["swap/a1/steps"] == 3 and metrics["swap/a1/budget_met"] == 0
    assert metrics["swap/a1/swapped"] == 0
    assert 0.5 < metrics["swap/a1/kl"] < metrics["swap/a1/kl_before"]
    # a1 is its outgoing self again: its model, its weights, β and optimiser state
    assert runtime.team.agent_paths == ["builtin:tiny", "builtin:tiny"]
    kept = runtime.team.learners[1]
    assert kept.region.beta == outgoing.region.beta
    for name, tensor in outgoing.weights().items():
        assert torch.equal(kept.weights()[name], tensor), name
    assert_engine_holds_learner_weights(runtime, 1)
    retried = apply_swaps(runtime, config, recipe, 2, tmp_path)  # still due at the next stage
    assert retried["swap/a1/steps"] == 3 and retried["swap/a1/swapped"] == 0
    # the retry went on from the missed attempt's weights: on the same prompts, a fresh start
    # from π_pre (the attempt forgotten) begins farther from π_cur and ends farther
    (attempt,) = tmp_path.glob("attempt_a1_*.pt")
    attempt.unlink()
    fresh = apply_swaps(runtime, config, recipe, 2, tmp_path)
    assert retried["swap/a1/kl_before"] < fresh["swap/a1/kl_before"] - 0.1
    assert retried["swap/a1/kl"] < fresh["swap/a1/kl"] - 0.1


def test_on_budget_missed_keep_goes_on_with_the_incoming_agent(raw_tiny_model, tmp_path):
    _, runtime, _, _, metrics = run_with_swap(
        raw_tiny_model, 0.5, 3, tmp_path, on_budget_missed="keep"
    )
    assert metrics["swap/a1/budget_met"] == 0 and metrics["swap/a1/swapped"] == 1
    assert runtime.team.agent_paths == ["builtin:tiny", raw_tiny_model]


def test_a_budget_pi_pre_meets_is_taken_as_it_is(raw_tiny_model, tmp_path):
    _, runtime, _, _, metrics = run_with_swap(raw_tiny_model, 1e6, 60, tmp_path)
    assert metrics["swap/a1/lambda"] == 0.0 and metrics["swap/a1/steps"] == 0
    raw = runtime.learner_factory.start(1, raw_tiny_model)
    for key, tensor in raw.weights().items():  # no projection: the incoming model unchanged
        assert torch.equal(runtime.team.learners[1].weights()[key], tensor)


def test_a_different_tokenizer_is_refused_naming_both_models():
    tokenizer = load_tokenizer(resolve_model_path("builtin:tiny"))
    other = load_tokenizer(resolve_model_path("builtin:tiny"))
    other.add_tokens(["<an-extra-token>"])
    check_same_tokenizer(
        tokenizer, "builtin:tiny", load_tokenizer(resolve_model_path("builtin:tiny")), "x"
    )
    with pytest.raises(ValueError, match=r"'builtin:tiny' for '/models/other'.*tokenizers differ"):
        check_same_tokenizer(tokenizer, "builtin:tiny", other, "/models/other")


def test_swaps_must_name_a_team_agent():
    from satseq.config import ConfigError

    with pytest.raises(ConfigError, match=r"team.swaps\[0\].agent: 'zz' is not a team agent"):
        load_config(QUICKSTART, ["team.swaps=[{agent: zz, path: /m, at_stage: 1}]"])
    with pytest.raises(ConfigError, match="delta0"):
        load_config(QUICKSTART, ["team.swaps=[{agent: a0, path: /m, at_stage: 1, delta0: 0}]"])


def test_cli_swap_applies_at_the_stage_after_the_last_checkpoint(tmp_path):
    import typer

    from satseq.cli.train import next_stage, with_swaps

    config = load_config(QUICKSTART, [])
    assert next_stage(config, tmp_path, resume=True) == 0  # no checkpoint yet
    (tmp_path / "checkpoints" / "stage_4").mkdir(parents=True)
    (tmp_path / "checkpoints" / "stage_4" / "run.pt").write_bytes(b"")
    assert next_stage(config, tmp_path, resume=True) == 5
    assert next_stage(config, tmp_path, resume=False) == 0
    (swap,) = with_swaps(config, ["a2=/models/stronger"], 5).team.swaps
    assert (swap.agent, swap.path, swap.at_stage) == ("a2", "/models/stronger", 5)
    for bad in ("a2", "zz=/models/stronger"):
        with pytest.raises(typer.Exit):
            with_swaps(config, [bad], 5)
