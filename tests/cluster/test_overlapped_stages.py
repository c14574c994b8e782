"""Overlapped stages (`rollout.max_staleness: 1`, DESIGN §12) of each recipe on the in-process
runtime: stage s + 1 is generated while stage s updates, trained on with the truncated
off-policy weight, and certified against the team that sampled it."""

import pytest
import torch

from satseq.cluster.recipes import RECIPES
from satseq.cluster.stage_batch import StageBatch
from satseq.cluster.team import start_in_process
from satseq.cluster.training_data import training_problems
from satseq.config import QUICKSTART, ConfigError, load_config


@pytest.fixture(scope="module")
def quickstart_model(builtin_models):
    return load_config(QUICKSTART).team.agents[0].path


def run(model_path, algorithm, max_staleness, stages=3):
    agents = ", ".join(f"{{name: a{i}, path: '{model_path}'}}" for i in range(2))
    config = load_config(
        QUICKSTART,
        [
            f"algorithm.name={algorithm}",
            f"team.agents=[{agents}]",
            f"rollout.max_staleness={max_staleness}",
            f"trainer.stages={stages}",
            "trainer.batch_size=8",
            "sat_seq.group_size=4",
            "grpo.group_size=2",
            "rollout.max_new_tokens=24",
            "data.synthetic.n_train=64",
        ],
    )
    recipe_class = RECIPES[algorithm]
    runtime = start_in_process(config, recipe_class.learner_settings(config))
    recipe = recipe_class(config, runtime, training_problems(config))
    results = [recipe.run_stage(k) for k in range(stages)]
    recipe.close()
    return results, recipe


def test_sat_seq_trains_stage_s_plus_1_on_the_rollouts_version_s_generated(quickstart_model):
    results, recipe = run(quickstart_model, "sat_seq", 1)
    staleness = [r.metrics["async/staleness_mean"] for r in results]
    assert staleness == [0.0, 1.0, 1.0]  # stage 0 generated its own; then one version old
    assert all(r.metrics["async/dropped"] == 0 for r in results)
    for result in results[1:]:
        m = result.metrics
        assert 0.0 < m["async/is_weight_min"] <= m["async/is_weight_mean"] <= 1.0
        assert result.certificate["bandit"]["from_version"] == results.index(result) - 1
    assert results[0].metrics["async/is_weight_min"] == 1.0  # the stage-start team sampled it
    assert "from_version" not in results[0].certificate["bandit"]
    busy = [r.metrics["util/engine_busy"] for r in results]
    assert all(0 < b <= 1 for b in busy[:-1]) and busy[-1] == 0  # the last generates no more
    assert recipe.queue.state_dict() == {"queued": {}}  # the last stage generated nothing ahead


def test_at_k_0_no_rollout_is_stale_and_no_behaviour_logprobs_are_asked(quickstart_model):
    results, _ = run(quickstart_model, "sat_seq", 0, stages=2)
    assert not any(key.startswith("async/") for key in results[0].metrics)
    assert all("from_version" not in r.certificate["bandit"] for r in results)


@pytest.mark.parametrize("algorithm", ["grpo", "spo"])
def test_grpo_and_spo_run_one_stage_ahead(quickstart_model, algorithm):
    results, _ = run(quickstart_model, algorithm, 1)
    assert [r.metrics["async/staleness_mean"] for r in results] == [0.0, 1.0, 1.0]
    assert 0.0 < results[2].metrics["async/is_weight_mean"] <= 1.0


def test_the_off_policy_weight_is_the_truncated_ratio_of_the_whole_response():
    """min(1, exp(Σ_t logp_cur − logp_behaviour)) over each row's tokens, every owner's."""
    from satseq.actors.trajectory import Trajectory
    from satseq.cluster.recipes.stage_rollouts import off_policy_weights
    from satseq.cluster.rollout_queue import StageRollouts

    rows = [
        Trajectory(0, [1], [5, 6], [1, 1], [0, 1], "stop", behaviour_logprobs=[-1.0, -2.0]),
        Trajectory(0, [1], [7, 8], [1, 0], [1, 1], "stop", behaviour_logprobs=[-0.5, -9.0]),
    ]
    batch = StageBatch.build(rows, n_agents=2)
    logp_cur = torch.tensor([[-1.5, -1.0], [-0.2, -3.0]])
    stale = StageRollouts(stage=2, version=1, plan=None)
    w = off_policy_weights(batch, logp_cur, stale, max_log_ratio=5.0)
    # row 0: (−1.5 + 1) + (−1 + 2) = 0.5 → min(1, e^0.5) = 1; row 1: −0.2 + 0.5 = 0.3 (the
    # second token is tool output, masked) → 1
    assert w.tolist() == [1.0, 1.0]
    # one nat lower: row 0 −1.5 → e^−1.5 = 0.223130, row 1 −1.2 + 0.5 = −0.7 → e^−0.7 = 0.496585
    w = off_policy_weights(batch, logp_cur - 1.0, stale, max_log_ratio=5.0)
    assert w.tolist() == pytest.approx([0.223130, 0.496585], rel=1e-5)
    fresh = StageRollouts(stage=2, version=2, plan=None)
    assert off_policy_weights(batch, logp_cur - 1.0, fresh, 5.0).tolist() == [1.0, 1.0]


def test_overlap_is_refused_where_engines_sleep_while_learners_work():
    with pytest.raises(ConfigError, match=r"rollout\.max_staleness.*idle_agents"):
        load_config(QUICKSTART, ["rollout.max_staleness=1", "trainer.offload=idle_agents"])
