"""The trust-region controller and its attempt loop, over a real torch model's weights, and the
backtracking snapshot that the loop restores (`satseq.actors.learner.snapshot`)."""

import pytest
import torch

from satseq.actors.learner.snapshot import TrainingSnapshot
from satseq.algo.trust_region import StepDecision, TrustRegion


def test_judge_accepts_backtracks_and_grows_beta():
    region = TrustRegion(target_kl=0.1, alpha=0.1, max_backtracks=2, beta=0.04)
    assert region.judge(0.05) is StepDecision.ACCEPT
    assert region.beta == 0.04
    assert region.judge(0.2) is StepDecision.BACKTRACK
    assert region.beta == pytest.approx(0.06)
    assert region.judge(0.2) is StepDecision.BACKTRACK
    assert region.judge(0.2) is StepDecision.REJECT  # third violation: 1 + max_backtracks attempts
    assert region.beta == pytest.approx(0.04 * 1.5**3)


def test_exhausted_keep_mode():
    region = TrustRegion(target_kl=0.1, alpha=0.1, max_backtracks=0, beta=1.0, on_exhausted="keep")
    assert region.judge(0.5) is StepDecision.KEEP


def test_non_finite_kl_is_never_accepted():
    # a NaN or infinite q (NaN weights after a step) is a violation, even in keep mode: the
    # weights go back to the epoch's start
    region = TrustRegion(target_kl=1e9, alpha=0.1, max_backtracks=1, beta=1.0)
    assert region.judge(float("nan")) is StepDecision.BACKTRACK
    assert region.judge(float("inf")) is StepDecision.REJECT
    keep = TrustRegion(target_kl=1e9, alpha=0.1, max_backtracks=0, beta=1.0, on_exhausted="keep")
    assert keep.judge(float("nan")) is StepDecision.REJECT


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5)
    return model, optimizer


def _sgd_step(model, optimizer):
    optimizer.zero_grad()
    model(torch.ones(4, 3)).pow(2).sum().backward()
    optimizer.step()


def _state_equal(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def _trust_region_step(region, model, optimizer, take_step):
    """One step of attempts, as the learner takes it (`satseq.actors.learner.update`)."""
    save = lambda: TrainingSnapshot().save(model, optimizer)  # noqa: E731
    for beta, step_scale in region.attempts(save, lambda s: s.restore(model, optimizer)):
        region.judge(take_step(beta, step_scale))
    return region.outcome


def test_rejected_step_restores_weights_and_optimizer_state():
    model, optimizer = _model_and_optimizer()
    _sgd_step(model, optimizer)  # give AdamW some moment state
    before = TrainingSnapshot().save(model, optimizer)
    region = TrustRegion(target_kl=0.01, alpha=0.1, max_backtracks=2, beta=0.1)
    betas_seen = []

    def take_step(beta, step_scale):
        betas_seen.append((beta, step_scale))
        _sgd_step(model, optimizer)
        return 1.0  # always violates

    outcome = _trust_region_step(region, model, optimizer, take_step)
    assert outcome.decision is StepDecision.REJECT and not outcome.applied
    assert outcome.backtracks == 2 and len(outcome.kl_quantiles) == 3
    assert [beta for beta, _ in betas_seen] == pytest.approx([0.1, 0.15, 0.225])
    assert [scale for _, scale in betas_seen] == [1.0, 0.5, 0.25]  # each retry halves the step
    assert _state_equal(model.state_dict(), before.model)
    after_opt = optimizer.state_dict()["state"]
    for key, state in before.optimizer["state"].items():
        assert torch.equal(after_opt[key]["exp_avg"], state["exp_avg"])
        assert torch.equal(after_opt[key]["step"], state["step"])
    # β persists into the next step
    assert region.beta == pytest.approx(0.1 * 1.5**3)


def test_step_accepted_after_backtrack_keeps_new_weights():
    model, optimizer = _model_and_optimizer()
    before = TrainingSnapshot().save(model, optimizer)
    region = TrustRegion(target_kl=0.1, alpha=0.1, max_backtracks=3, beta=0.1)
    quantiles = iter([0.3, 0.05])

    def take_step(beta, step_scale):
        _sgd_step(model, optimizer)
        return next(quantiles)

    outcome = _trust_region_step(region, model, optimizer, take_step)
    assert outcome.decision is StepDecision.ACCEPT and outcome.applied
    assert outcome.backtracks == 1 and outcome.kl_quantiles == [0.3, 0.05]
    assert not _state_equal(model.state_dict(), before.model)
    # exactly one step's worth of AdamW state: the violating attempt left no trace
    assert all(int(s["step"]) == 1 for s in optimizer.state_dict()["state"].values())


def test_snapshot_reuses_its_cpu_buffers_and_survives_steps_after_a_restore():
    """A learner snapshots before every step: its arena is allocated once, and a restore
    must not hand its places to the optimiser (its in-place updates would corrupt the snapshot)."""
    model, optimizer = _model_and_optimizer()
    _sgd_step(model, optimizer)
    snapshot = TrainingSnapshot().save(model, optimizer)
    places = {key: place.data_ptr() for key, place in snapshot._places.items()}
    saved = {k: v.clone() for k, v in snapshot.model.items()}
    exp_avg = {k: s["exp_avg"].clone() for k, s in snapshot.optimizer["state"].items()}
    for _ in range(2):  # step, restore, step again: the second restore still sees the first state
        _sgd_step(model, optimizer)
        snapshot.restore(model, optimizer)
    assert _state_equal(model.state_dict(), saved)
    for key, state in optimizer.state_dict()["state"].items():
        assert torch.equal(state["exp_avg"], exp_avg[key])
    assert snapshot.save(model, optimizer) is snapshot
    assert {key: place.data_ptr() for key, place in snapshot._places.items()} == places
    assert snapshot._arena.device.type == "cpu"
    assert (
        snapshot.nbytes
        == snapshot._arena.nbytes
        >= sum(p.nbytes for p in snapshot._places.values())
        > 0
    )


def test_state_dict_round_trip():
    region = TrustRegion(target_kl=0.1, alpha=0.1, max_backtracks=3, beta=0.7)
    other = TrustRegion(target_kl=0.1, alpha=0.1, max_backtracks=3, beta=0.1)
    other.load_state_dict(region.state_dict())
    assert other.beta == 0.7
