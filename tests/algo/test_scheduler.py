"""The per-stage agent order: static, seeded random, and greedy by gain."""

import pytest

from satseq.algo.scheduler import AgentScheduler, order_by_score

AGENTS = ["solver", "checker", "writer", "critic"]


def test_static_keeps_the_config_order():
    scheduler = AgentScheduler(AGENTS, mode="static")
    for stage in range(5):
        assert scheduler.order(stage, last_gains={"critic": 9.0}) == AGENTS


def test_random_is_seeded_and_permutes_across_stages():
    scheduler = AgentScheduler(AGENTS, mode="random", seed=7)
    orders = [scheduler.order(stage) for stage in range(12)]
    assert all(sorted(order) == sorted(AGENTS) for order in orders)
    assert len({tuple(order) for order in orders}) > 3  # it really reorders
    assert any(order != AGENTS for order in orders)
    # the same seed and stage reproduce the order, in any call sequence (resume)
    again = AgentScheduler(AGENTS, mode="random", seed=7)
    assert [again.order(stage) for stage in reversed(range(12))] == orders[::-1]
    other_seed = AgentScheduler(AGENTS, mode="random", seed=8)
    assert [other_seed.order(stage) for stage in range(12)] != orders


def test_greedy_gain_orders_by_last_gain_descending():
    scheduler = AgentScheduler(AGENTS, mode="greedy_gain")
    gains = {"solver": 0.01, "checker": 0.30, "writer": -0.02, "critic": 0.05}
    mean_abs_advantage = {"solver": 9.0, "checker": 0.0, "writer": 0.0, "critic": 0.0}
    expected = ["checker", "critic", "solver", "writer"]
    assert scheduler.order(3, gains, mean_abs_advantage) == expected


def test_greedy_gain_falls_back_to_mean_abs_advantage_on_the_first_stage():
    scheduler = AgentScheduler(AGENTS, mode="greedy_gain")
    mean_abs_advantage = {"solver": 0.2, "checker": 0.1, "writer": 0.9, "critic": 0.4}
    expected = ["writer", "critic", "solver", "checker"]
    assert scheduler.order(0, None, mean_abs_advantage) == expected
    assert scheduler.order(0, {}, mean_abs_advantage) == expected
    with pytest.raises(ValueError, match="needs last_gains"):
        scheduler.order(0)


def test_order_by_score_ties_keep_config_order_and_nan_goes_last():
    score = {"solver": 0.1, "checker": float("nan"), "writer": 0.1, "critic": 0.5}
    assert order_by_score(AGENTS, score) == ["critic", "solver", "writer", "checker"]
    with pytest.raises(ValueError, match=r"\['critic'\]"):
        order_by_score(AGENTS, {"solver": 1.0, "checker": 1.0, "writer": 1.0})


def test_state_dict_round_trip():
    scheduler = AgentScheduler(AGENTS, mode="random", seed=11)
    resumed = AgentScheduler(["x"], mode="static")
    resumed.load_state_dict(scheduler.state_dict())
    assert resumed.state_dict() == scheduler.state_dict()
    assert [resumed.order(s) for s in range(4)] == [scheduler.order(s) for s in range(4)]


def test_rejects_unknown_mode_and_duplicate_agents():
    with pytest.raises(ValueError, match="unknown"):
        AgentScheduler(AGENTS, mode="round_robin")
    with pytest.raises(ValueError, match="distinct"):
        AgentScheduler(["a", "a"])
