"""DAPO's dynamic sampling (`rollout.dynamic_sampling`): degenerate groups (every reward equal,
no gradient) are dropped and more prompts drawn, in the recipe's order, up to `max_rounds`."""

import pytest

from satseq.actors.trajectory import Trajectory
from satseq.cluster.recipes import RECIPES
from satseq.cluster.recipes.stage_rollouts import dynamically_sampled
from satseq.cluster.team import start_in_process
from satseq.cluster.training_data import training_problems
from satseq.config import QUICKSTART, ConfigError, load_config
from tests.cluster.test_recipe_wiring import RecordingRuntime


def scored(problems, rewards_of):
    """Two trajectories per problem with the rewards rewards_of[problem] (a fake generation's
    output: the rule under test only reads rewards)."""
    return [
        Trajectory(0, [1], [2], [1], [0], "stop", reward=reward)
        for problem in problems
        for reward in rewards_of[problem]
    ]


def test_rounds_keep_groups_with_a_gradient_and_draw_in_order_until_b_are_kept():
    rewards = {"a": (1, 1), "b": (0, 1), "c": (0, 0), "d": (1, 0), "e": (1, 0), "f": (0, 0)}
    order = iter("cdef")
    calls = []

    def generate(problems, first, round_):
        calls.append((list(problems), first, round_))
        return scored(problems, rewards)

    sampled = dynamically_sampled(
        ["a", "b"], generate, lambda n: [next(order) for _ in range(n)], 2, max_rounds=5
    )
    assert sampled.problems == ["b", "d"]  # a and c were degenerate; d filled the batch
    assert [t.reward for t in sampled.trajectories] == [0, 1, 1, 0]
    # one model-written token per trajectory: 8 generated, 4 trained on
    assert sampled.metrics == {
        "groups/kept": 2, "groups/drawn": 4, "groups/rounds": 2, "tokens/dropped": 4
    }  # fmt: skip
    assert calls == [(["a", "b"], 0, 0), (["c", "d"], 2, 1)]


def test_a_prompt_is_kept_by_the_groups_its_advantages_use():
    """Multi-agent GRPO: a prompt's 4 rollouts are two agents' groups of 2. Rewards (1, 1 | 0, 0)
    give both groups A = 0: dropped, though its 4 rewards differ; (1, 0 | 1, 1) has one group
    with a gradient: kept."""
    rewards = {"a": (1, 1, 0, 0), "b": (1, 0, 1, 1), "c": (0, 0, 0, 0), "d": (0, 0, 0, 1)}
    order = iter("cd")
    sampled = dynamically_sampled(
        ["a", "b"],
        lambda problems, first, r: scored(problems, rewards),
        lambda n: [next(order) for _ in range(n)],
        4,
        max_rounds=3,
        group_size=2,
    )
    assert sampled.problems == ["b", "d"]
    assert sampled.metrics["groups/drawn"] == 4


def two_rounds_at_most(rewards):
    """a and b, then c and d: two rollouts a prompt, `max_rounds` 2."""
    order = iter("cdef")
    return dynamically_sampled(
        ["a", "b"],
        lambda problems, first, r: scored(problems, rewards),
        lambda n: [next(order) for _ in range(n)],
        2,
        max_rounds=2,
    )


def test_max_rounds_bounds_the_draws_and_the_stage_trains_on_what_it_kept():
    sampled = two_rounds_at_most({p: (0, 0) for p in "abcdef"} | {"d": (0, 1)})
    assert sampled.problems == ["d"] and sampled.metrics["groups/rounds"] == 2
    assert sampled.metrics["groups/drawn"] == 4 and sampled.metrics["tokens/dropped"] == 6


def test_a_stage_that_kept_nothing_trains_the_last_rounds_prompts_as_drawn():
    """No round has a gradient (the e2e SmolLM2 stage met it: 2 prompts, 2 rounds, all 0):
    the stage still gets a batch, the last round's, every advantage 0."""
    sampled = two_rounds_at_most({p: (0, 0) for p in "abcdef"} | {"e": (0, 1)})  # e: round 3
    assert sampled.problems == ["c", "d"] and len(sampled.trajectories) == 4
    assert sampled.metrics == {
        "groups/kept": 0, "groups/drawn": 4, "groups/rounds": 2, "tokens/dropped": 4
    }  # fmt: skip


@pytest.fixture(scope="module")
def quickstart_model(builtin_models):
    return load_config(QUICKSTART).team.agents[0].path


@pytest.mark.parametrize(("algorithm", "n_agents"), [("sat_seq", 1), ("grpo", 1), ("grpo", 2)])
def test_a_stage_trains_only_on_groups_with_a_gradient(quickstart_model, algorithm, n_agents):
    agents = ", ".join(f"{{name: a{i}, path: '{quickstart_model}'}}" for i in range(n_agents))
    config = load_config(
        QUICKSTART,
        [
            f"algorithm.name={algorithm}",
            f"team.agents=[{agents}]",
            "rollout.dynamic_sampling.enabled=true",
            "rollout.dynamic_sampling.max_rounds=3",
            "trainer.batch_size=8",
            "sat_seq.group_size=4",
            "grpo.group_size=4",
            "rollout.max_new_tokens=24",
            "data.synthetic.n_train=64",
        ],
    )
    recipe_class = RECIPES[algorithm]
    runtime = RecordingRuntime(start_in_process(config, recipe_class.learner_settings(config)))
    recipe = recipe_class(config, runtime, training_problems(config))
    result = recipe.run_stage(0)
    recipe.close()
    m = result.metrics
    trained = 6 if algorithm == "sat_seq" else 8  # SAT-Seq holds 2 of its 8 prompts out
    assert 1 <= m["groups/rounds"] <= 3 and m["groups/drawn"] >= trained
    # every kept prompt has an advantage group (an agent's G = 4 answers) whose rewards differ
    batch = runtime.called("logprobs")[0][1][0]
    per_prompt = 4 * n_agents
    kept = batch.rewards[: m["groups/kept"] * per_prompt].view(-1, n_agents, 4)
    differs = kept.amax(-1) > kept.amin(-1)  # [prompts, agents]
    assert differs.any(-1).all()
    assert m["groups/degenerate_fraction"] == pytest.approx(float((~differs).float().mean()))
    assert m["groups/kept"] <= trained
    assert m["groups/kept"] == trained or m["groups/rounds"] == 3
    # every dropped group's tokens are counted (at least one token a response)
    assert (m["tokens/dropped"] > 0) == (m["groups/drawn"] > m["groups/kept"])
    assert recipe.cursor.state_dict()["position"] == 8 + m["groups/drawn"] - trained


def test_spo_refuses_dynamic_sampling_naming_the_key():
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        load_config(QUICKSTART, ["algorithm.name=spo", "rollout.dynamic_sampling.enabled=true"])
