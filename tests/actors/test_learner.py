"""The learner in-process: teacher-forced log-probs, the update's direction, the trust region's
restore, micro-batch accumulation and state round trips."""

import copy
import math

import pytest
import torch

from satseq.actors import packing
from satseq.actors.learner import (
    Learner,
    LearnerSpec,
    LossSpec,
    OptimizerSpec,
    TrustRegionSpec,
)
from satseq.actors.trajectory import Trajectory, pad_batch
from satseq.algo.kl import kl_quantile
from satseq.algo.logprobs import token_logprobs


def trajectories(tokenizer, owners=(0, 0, 0, 0)):
    prompts = ["1+2=", "3+4=", "5+6=", "7+8="]
    responses = ["3 \\boxed{3}", "7", "11 \\boxed{11}", "15 ok"]
    out = []
    for i, (prompt, response, owner) in enumerate(zip(prompts, responses, owners, strict=True)):
        ids = tokenizer.encode(response, add_special_tokens=False)
        out.append(
            Trajectory(
                prompt_index=i,
                prompt_ids=tokenizer.encode(prompt, add_special_tokens=False),
                response_ids=ids,
                response_mask=[1] * len(ids),
                owner_ids=[owner] * len(ids),
                finish_reason="stop",
            )
        )
    return out


def make_learner(
    path, lr=1e-2, target_kl=10.0, max_backtracks=3, kl_coef=0.01, kl_estimator="exact", **overrides
):
    spec = dict(
        model_path=path,
        agent_index=0,
        micro_batch_size=4,
        optimizer=OptimizerSpec(lr=lr),
        trust_region=TrustRegionSpec(
            target_kl=target_kl,
            max_backtracks=max_backtracks,
            kl_coef=kl_coef,
            kl_estimator=kl_estimator,
        ),
    )
    spec.update(overrides)
    return Learner(LearnerSpec(**spec))


def test_logprobs_are_teacher_forced_at_the_sampling_temperature(raw_tiny_model):
    learner = make_learner(raw_tiny_model, temperature=0.7)
    batch_trajs = trajectories(learner.policy.tokenizer)
    logp = learner.logprobs(batch_trajs)
    t = batch_trajs[1]
    ids = torch.tensor([t.prompt_ids + t.response_ids])
    with torch.no_grad():
        logits = learner.policy.model(input_ids=ids).logits[0]
    start = len(t.prompt_ids)
    expected = token_logprobs(
        logits[start - 1 : -1].unsqueeze(0), torch.tensor([t.response_ids]), 0.7
    )
    assert torch.allclose(logp[1, : len(t.response_ids)], expected[0], atol=1e-5)


def test_update_moves_logprobs_in_the_direction_of_the_advantage(raw_tiny_model):
    # small steps, so each sequence moves by its own gradient rather than its neighbours'
    learner = make_learner(raw_tiny_model, lr=1e-4, kl_estimator="k3", ppo_epochs=3)
    batch_trajs = trajectories(learner.policy.tokenizer)
    mask = pad_batch(batch_trajs, learner.policy.pad_token_id).response_mask
    logp_cur = learner.logprobs(batch_trajs)
    A = torch.tensor([1.0, -1.0, 1.0, -1.0])
    result = learner.update(batch_trajs, logp_cur, A, torch.ones(4))
    assert result.accepted_steps == 3 and result.backtracks == 0
    delta = ((result.logp_hat - logp_cur) * mask).sum(-1)
    assert delta[0] > 0 and delta[2] > 0 and delta[1] < 0 and delta[3] < 0
    # logp_hat is what the learner now computes
    assert torch.allclose(result.logp_hat * mask, learner.logprobs(batch_trajs) * mask, atol=1e-5)


def test_violated_trust_region_restores_weights_and_grows_beta(raw_tiny_model):
    learner = make_learner(raw_tiny_model, target_kl=1e-12, max_backtracks=1, kl_coef=0.1)
    batch_trajs = trajectories(learner.policy.tokenizer)
    before = {k: v.clone() for k, v in learner.policy.model.state_dict().items()}
    logp_cur = learner.logprobs(batch_trajs)
    result = learner.update(
        batch_trajs, logp_cur, torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.ones(4)
    )
    assert result.accepted_steps == 0 and result.backtracks == 1
    assert learner.region.beta == pytest.approx(0.1 * 1.5**2)
    assert all(torch.equal(before[k], v) for k, v in learner.policy.model.state_dict().items())
    assert learner.policy.optimizer.state_dict()["state"] == {}
    assert torch.equal(result.logp_hat, logp_cur)


def test_micro_batches_accumulate_to_the_full_batch_gradient(raw_tiny_model):
    steps = []
    for micro in (4, 1):
        learner = make_learner(raw_tiny_model, micro_batch_size=micro, kl_estimator="k3")
        # plain SGD: the step is then exactly the accumulated gradient (AdamW's first step is
        # ~lr·sign(g) and would magnify float noise on near-zero gradients)
        learner.policy.optimizer = torch.optim.SGD(learner.policy.model.parameters(), lr=0.1)
        initial = learner.weights()
        batch_trajs = trajectories(learner.policy.tokenizer)
        A = torch.tensor([1.0, -0.5, 0.3, -1.0])
        learner.update(batch_trajs, learner.logprobs(batch_trajs), A, torch.ones(4))
        steps.append(torch.cat([(v - initial[k]).flatten() for k, v in learner.weights().items()]))
    step_full, step_micro = steps
    assert step_full.norm() > 0
    # float32 sums in another order agree to ~1e-6 relative; a wrong weighting is O(1) off
    assert (step_full - step_micro).norm() / step_full.norm() < 1e-4


def uneven_trajectories(tokenizer):
    """Responses of very different lengths (1 to ~40 tokens), where a token mean and a mean of
    sequence means differ most."""
    counts = " ".join(str(n) for n in range(1, 21))
    prompts, responses = ["1+2=", "3+4=", "5+6=", "7+8="], ["3", counts, "11", counts + " ok"]
    out = []
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        ids = tokenizer.encode(response, add_special_tokens=False)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        out.append(Trajectory(i, prompt_ids, ids, [1] * len(ids), [0] * len(ids), "stop"))
    return out


@pytest.mark.parametrize(("ratio", "aggregation"), [("seq", "seq_mean"), ("token", "token_mean")])
def test_a_penalised_step_is_the_same_for_any_micro_batch_split(raw_tiny_model, ratio, aggregation):
    """design §4: the KL penalty is aggregated as the policy term, so the second epoch's step
    (where θ ≠ π_cur and β acts) is the same with micro-batches of 4 and of 1 over sequences
    of 1 to 40 tokens. (A token mean inside each micro-batch, weighted by sequence count, made
    the seq-mean penalty depend on the split.)"""
    steps = []
    for micro in (4, 1):
        learner = make_learner(
            raw_tiny_model,
            micro_batch_size=micro,
            kl_coef=5.0,
            target_kl=1e9,
            ppo_epochs=2,
            loss=LossSpec(ratio=ratio, aggregation=aggregation),
        )
        learner.policy.optimizer = torch.optim.SGD(learner.policy.model.parameters(), lr=0.5)
        initial = learner.weights()
        batch = uneven_trajectories(learner.policy.tokenizer)
        A = torch.tensor([1.0, -0.5, 0.3, -1.0])
        result = learner.update(batch, learner.logprobs(batch), A, torch.ones(4))
        assert result.kl_penalty > 1e-4  # the second step paid a visible penalty
        steps.append(torch.cat([(v - initial[k]).flatten() for k, v in learner.weights().items()]))
    whole, split = steps
    assert (whole - split).norm() / whole.norm() < 1e-4


def test_a_rejected_epoch_restores_a_non_empty_adamw_state(raw_tiny_model):
    """The backtracking snapshot restores AdamW's moments and step count, not only weights:
    after an accepted update, a rejected one leaves weights and optimiser state bit for bit as
    the accepted one left them."""
    learner = make_learner(raw_tiny_model, lr=1e-2, target_kl=1e9, mini_batch_size=2)
    batch = trajectories(learner.policy.tokenizer)
    A = torch.tensor([1.0, -0.5, 0.3, -1.0])
    learner.update(batch, learner.logprobs(batch), A, torch.ones(4))
    weights = learner.weights()
    state = copy.deepcopy(learner.policy.optimizer.state_dict())
    assert state["state"] and all(s["exp_avg_sq"].abs().sum() > 0 for s in state["state"].values())
    learner.region.target_kl = 1e-12  # every attempt of the next update violates
    result = learner.update(batch, learner.logprobs(batch), -A, torch.ones(4))
    assert result.accepted_steps == 0 and result.backtracks == 3
    assert all(torch.equal(weights[name], tensor) for name, tensor in learner.weights().items())
    restored = learner.policy.optimizer.state_dict()
    for index, saved in state["state"].items():
        for key, value in saved.items():
            assert torch.equal(
                torch.as_tensor(restored["state"][index][key]), torch.as_tensor(value)
            )


def test_a_held_out_check_measures_rows_it_never_trains_on(raw_tiny_model):
    """`kl_ctrl.measure_on: held_out`: the last rows are measured by the KL check (their
    sequence KLs and q come from them) and never trained on (whatever their A, the weights are
    those of an update on the training rows alone); logp_hat covers both rows' kinds."""
    plain = make_learner(raw_tiny_model, lr=1e-2, target_kl=1e9, ppo_epochs=2)
    rows = trajectories(plain.policy.tokenizer)
    plain.update(rows[:2], None, torch.tensor([1.0, -0.5]), torch.ones(2))
    learner = make_learner(raw_tiny_model, lr=1e-2, target_kl=1e9, ppo_epochs=2)
    A = torch.tensor([1.0, -0.5, 5.0, 5.0])  # the held-out rows' A must not act
    result = learner.update(rows, None, A, torch.ones(4), held_out=2)
    trained = plain.weights()
    assert all(torch.equal(trained[name], w) for name, w in learner.weights().items())
    assert torch.isnan(result.sequence_kl[:2]).all() and (result.sequence_kl[2:] > 0).all()
    assert result.kl_quantile == pytest.approx(kl_quantile(result.sequence_kl[2:], 0.1))
    after = learner.logprobs(rows)
    assert torch.allclose(result.logp_hat[:, : after.shape[1]], after, atol=1e-5)


ON_POLICY_UPDATES = {
    "plain PPO-clip (GRPO, SPO)": dict(
        loss=LossSpec(ratio="token", aggregation="token_mean"),
        trust_region=TrustRegionSpec(enabled=False, kl_estimator="k3"),
    ),
    "two trust-region steps, exact KL": dict(ppo_epochs=2),
    "three steps, k3 KL": dict(ppo_epochs=3, kl_estimator="k3"),
    "two epochs of two mini-batches": dict(ppo_epochs=2, mini_batch_size=2),
    "a rejected step, retried after a restore": dict(
        target_kl=1e-12, max_backtracks=1, kl_coef=0.1
    ),
}


@pytest.mark.parametrize("settings", ON_POLICY_UPDATES.values(), ids=ON_POLICY_UPDATES.keys())
def test_on_policy_update_takes_behaviour_logprobs_from_its_first_forward_pass(
    raw_tiny_model, settings
):
    """logp_cur None (π_old is the learner's current weights): the update is the one a
    separate log-prob pass would have fed, without that pass."""
    A = torch.tensor([1.0, -0.5, 0.3, -1.0])
    results, weights = [], []
    for from_update in (False, True):
        learner = make_learner(raw_tiny_model, lr=1e-3, **settings)
        batch_trajs = trajectories(learner.policy.tokenizer)
        logp_cur = None if from_update else learner.logprobs(batch_trajs)
        results.append(learner.update(batch_trajs, logp_cur, A, torch.ones(4)))
        weights.append(learner.weights())
    separate, first_forward = results
    for step, expected in zip(first_forward.steps, separate.steps, strict=True):
        assert (step.decision, step.backtracks, step.beta) == (
            expected.decision,
            expected.backtracks,
            expected.beta,
        )
        assert step.kl_quantiles == pytest.approx(expected.kl_quantiles, rel=1e-5, abs=1e-7)
    assert first_forward.loss == pytest.approx(separate.loss, rel=1e-6, abs=1e-7)
    assert first_forward.clip_fraction == pytest.approx(separate.clip_fraction)
    torch.testing.assert_close(first_forward.logp_hat, separate.logp_hat)
    for name, tensor in weights[0].items():
        torch.testing.assert_close(weights[1][name], tensor, rtol=1e-6, atol=1e-7)


def test_unmeasured_plain_steps_take_the_measured_steps_without_the_pass_after_them(
    raw_tiny_model,
):
    """GRPO without `grpo.measure_step_kl`: the same steps and weights, no q, no logp_hat."""
    A = torch.tensor([1.0, -0.5, 0.3, -1.0])
    results, weights = [], []
    for measure in (True, False):
        plain = TrustRegionSpec(enabled=False, kl_estimator="k3", measure=measure)
        loss = LossSpec(ratio="token", aggregation="token_mean")
        learner = make_learner(raw_tiny_model, lr=1e-3, trust_region=plain, loss=loss)
        results.append(
            learner.update(trajectories(learner.policy.tokenizer), None, A, torch.ones(4))
        )
        weights.append(learner.weights())
    measured, unmeasured = results
    assert measured.kl_quantile > 0 and measured.logp_hat is not None
    assert math.isnan(unmeasured.kl_quantile) and unmeasured.logp_hat is None
    assert unmeasured.loss == measured.loss and unmeasured.accepted_steps == 1
    for name, tensor in weights[0].items():
        assert torch.equal(weights[1][name], tensor), name
    with pytest.raises(ValueError, match="cannot skip measuring"):
        TrustRegionSpec(enabled=True, measure=False)


@pytest.mark.parametrize("packed", [True, False])
def test_the_update_reports_the_padding_of_the_layout_it_ran(raw_tiny_model, packed, monkeypatch):
    learner = make_learner(raw_tiny_model)
    if not packed:
        monkeypatch.setattr(packing, "packable", lambda config: False)
    # prompts of 4 tokens, responses of 8, 1, 2 and 3: 30 tokens in rows of 12
    batch = [
        Trajectory(k, [5 + k] * 4, [9] * R, [1] * R, [0] * R, "stop")
        for k, R in enumerate((8, 1, 2, 3))
    ]
    result = learner.update(batch, None, torch.linspace(-1, 1, 4), torch.ones(4))
    # packed: [12], [7, 5], [6] in 3 rows; padded: 4 rows
    assert result.padding_fraction == pytest.approx(1 - 30 / (36 if packed else 48))


def test_only_the_agents_own_tokens_are_trained(raw_tiny_model):
    learner = make_learner(raw_tiny_model)  # agent 0
    batch_trajs = trajectories(learner.policy.tokenizer, owners=(1, 1, 2, 2))
    before = learner.weights()
    result = learner.update(
        batch_trajs, learner.logprobs(batch_trajs), torch.ones(4), torch.ones(4)
    )
    assert result.steps == [] and result.tokens == 0
    assert all(torch.equal(before[k], v) for k, v in learner.weights().items())


def test_state_round_trip_through_a_checkpoint_file(raw_tiny_model, tmp_path):
    """What a learner writes to its checkpoint file resumes it exactly: β, weights, and the
    next update (the optimiser's moments included)."""
    learner = make_learner(raw_tiny_model)
    batch_trajs = trajectories(learner.policy.tokenizer)
    learner.update(batch_trajs, learner.logprobs(batch_trajs), torch.ones(4), torch.ones(4))
    other = make_learner(raw_tiny_model)
    other.load_state(learner.save_state(str(tmp_path / "stage_0" / "learner_0.pt")))
    assert other.region.beta == learner.region.beta
    assert all(torch.equal(learner.weights()[k], v) for k, v in other.weights().items())
    resumed = other.weights()
    for agent in (learner, other):
        agent.update(batch_trajs, agent.logprobs(batch_trajs), torch.ones(4), torch.ones(4))
    assert not all(torch.equal(resumed[k], v) for k, v in other.weights().items())
    assert other.region.beta == learner.region.beta
    assert all(torch.equal(learner.weights()[k], v) for k, v in other.weights().items())
    saved = learner.save_pretrained(str(tmp_path / "hf"))
    reloaded = make_learner(saved)
    assert all(torch.equal(learner.weights()[k], v) for k, v in reloaded.weights().items())


def test_reset_returns_a_learner_to_its_initial_state(raw_tiny_model):
    """A retry of stage 0 resets the learners: weights, β and the next update as if new."""
    learner = make_learner(raw_tiny_model, target_kl=1e-3)
    fresh = make_learner(raw_tiny_model, target_kl=1e-3)
    batch_trajs = trajectories(learner.policy.tokenizer)
    learner.update(batch_trajs, learner.logprobs(batch_trajs), torch.ones(4), torch.ones(4))
    learner.reset()
    assert learner.region.beta == fresh.region.beta
    for agent in (learner, fresh):
        agent.update(batch_trajs, agent.logprobs(batch_trajs), torch.ones(4), torch.ones(4))
    assert all(torch.equal(fresh.weights()[k], v) for k, v in learner.weights().items())


def test_value_head_starts_at_zero_and_fits_the_returns_of_the_agents_tokens(
    raw_tiny_model, tmp_path
):
    """`gae` mode's critic: V = 0 at first (GAE = discounted returns); fitting moves V towards
    the returns on the agent's own tokens, and never the policy."""
    learner = make_learner(raw_tiny_model, value_lr=5e-2, value_steps=60)
    batch_trajs = trajectories(learner.policy.tokenizer, owners=(0, 0, 1, 0))
    own = pad_batch(batch_trajs, learner.policy.pad_token_id).response_mask
    own[2] = 0  # agent 1's trajectory
    assert torch.equal(learner.values(batch_trajs), torch.zeros(own.shape))
    policy = learner.weights()
    returns = torch.full(own.shape, 0.7)
    loss = learner.fit_values(batch_trajs, returns)
    V = learner.values(batch_trajs)
    assert loss < 0.01 < 0.5 * 0.7**2  # ½ (V − 0.7)² fell from 0.245
    assert ((V - 0.7).abs() * own).sum() / own.sum() < 0.1
    assert all(torch.equal(policy[k], v) for k, v in learner.weights().items())

    untouched = make_learner(raw_tiny_model, value_lr=5e-2)
    assert (
        untouched.fit_values(trajectories(learner.policy.tokenizer, owners=(1, 1, 1, 1)), returns)
        == 0
    )
    assert torch.equal(untouched.values(batch_trajs), torch.zeros(own.shape))

    restored = make_learner(raw_tiny_model, value_lr=5e-2)
    restored.load_state(learner.save_state(str(tmp_path / "learner.pt")))
    assert torch.equal(restored.values(batch_trajs), V)
