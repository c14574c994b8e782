"""PPO mini-batches (design §4): each epoch deals the agent's stage batch into shuffled
mini-batches, one optimiser step each; logp_cur stays fixed, so after the first step the ratio
leaves 1 and the clip and the KL penalty act."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satseq.actors.learner.micro_batches import agent_rows, mini_batch_rows
from satseq.actors.learner.policy import micro_batch_parts
from tests.actors.test_learner import make_learner, trajectories

A = torch.tensor([1.0, -0.5, 0.3, -1.0])


def test_each_epoch_deals_the_agents_rows_into_fresh_shuffled_mini_batches(raw_tiny_model):
    learner = make_learner(raw_tiny_model, mini_batch_size=2)
    rows = [0, 1, 2, 3, 4]
    first, second = mini_batch_rows(learner.policy, rows), mini_batch_rows(learner.policy, rows)
    assert [len(batch) for batch in first] == [3, 2]  # round(5 / 2) steps, no step on 1 row
    assert sorted(row for batch in first for row in batch) == rows  # each row once an epoch
    assert sorted(row for batch in second for row in batch) == rows
    assert first != second  # the next epoch draws its own order


@pytest.mark.parametrize(
    ("n_rows", "size", "sizes"),
    [(9, 4, [5, 4]), (8, 4, [4, 4]), (7, 4, [4, 3]), (5, 4, [5]), (13, 4, [5, 4, 4]), (1, 4, [1])],
)
def test_a_remainder_is_spread_not_stepped_on_alone(raw_tiny_model, n_rows, size, sizes):
    """round(N / size) mini-batches whose sizes differ by at most one: 9 rows by 4 give 5 and 4,
    never a full Adam step on a remainder of one row (4, 4, 1)."""
    learner = make_learner(raw_tiny_model, mini_batch_size=size)
    assert [len(batch) for batch in mini_batch_rows(learner.policy, list(range(n_rows)))] == sizes


def test_the_rows_are_those_holding_the_agents_trained_tokens(raw_tiny_model):
    learner = make_learner(raw_tiny_model)  # agent 0
    batch = trajectories(learner.policy.tokenizer, owners=(0, 1, 0, 2))
    masked = batch[2]
    batch[2] = type(masked)(**{**masked.__dict__, "response_mask": [0] * len(masked.owner_ids)})
    assert agent_rows(learner.policy, batch) == [0]


def test_one_step_over_the_whole_batch_keeps_the_ratio_at_one(raw_tiny_model):
    """The special case mini_batch_size = batch: r ≡ 1 at the only step, so neither the clip
    nor β acts (what SAT-Seq ran before mini-batches)."""
    learner = make_learner(raw_tiny_model, lr=5e-2, kl_coef=0.5)
    batch = trajectories(learner.policy.tokenizer)
    result = learner.update(batch, learner.logprobs(batch), A, torch.ones(4))
    assert result.optimizer_steps == 1
    assert result.ratio_max == pytest.approx(1.0, abs=1e-5)
    assert result.clip_fraction == 0.0 and result.kl_penalty == 0.0


def test_later_steps_see_a_moved_ratio_so_the_clip_and_the_penalty_act(raw_tiny_model):
    learner = make_learner(
        raw_tiny_model, lr=1e-3, kl_coef=0.5, target_kl=1e9, mini_batch_size=2, ppo_epochs=2
    )
    batch = trajectories(learner.policy.tokenizer)
    logp_cur = learner.logprobs(batch)
    given = logp_cur.clone()
    result = learner.update(batch, logp_cur, A, torch.ones(4))
    assert torch.equal(logp_cur, given)  # π_old is fixed for the whole update
    assert result.optimizer_steps == 4  # 2 epochs × 2 mini-batches of 2
    assert len(result.steps) == 2 and result.accepted_steps == 2
    assert result.ratio_max > 1.2  # past 1 + ε: the clip is active
    assert result.clip_fraction > 0.0
    assert result.kl_penalty > 0.0


def test_a_violating_epoch_is_restored_to_its_start(raw_tiny_model):
    """The trust region checks each epoch as a whole: a rejected epoch leaves the weights (and
    the log-probs) as they were when it began."""
    learner = make_learner(
        raw_tiny_model, lr=5e-2, target_kl=1e-12, max_backtracks=1, mini_batch_size=2
    )
    batch = trajectories(learner.policy.tokenizer)
    before = learner.weights()
    logp_cur = learner.logprobs(batch)
    result = learner.update(batch, logp_cur, A, torch.ones(4))
    (epoch,) = result.steps
    assert not epoch.applied and epoch.backtracks == 1 and len(epoch.kl_quantiles) == 2
    assert result.optimizer_steps == 0
    assert all(torch.equal(before[name], tensor) for name, tensor in learner.weights().items())
    assert torch.equal(result.logp_hat, logp_cur)


def test_a_sequence_ratio_past_float32s_range_leaves_finite_weights(raw_tiny_model):
    """u sums the log-ratios of every token an agent wrote: 50 nats a token overflows e^u.
    The overflow once made an infinite loss, NaN gradients and NaN weights, so that every
    attempt failed the KL check and the update was rejected (seen on an H100 at 1,536
    tokens)."""
    learner = make_learner(raw_tiny_model, lr=1e-3, target_kl=1e9)
    batch = trajectories(learner.policy.tokenizer)
    stale = learner.logprobs(batch) - 50.0  # π_θ 50 nats a token likelier than behaviour
    result = learner.update(batch, stale, A, torch.ones(4))
    assert result.ratio_max == float("inf")  # e^u itself overflows: the metric says so
    assert result.accepted_steps == 1 and math.isfinite(result.loss)
    assert all(torch.isfinite(p).all() for p in learner.policy.model.parameters())


def test_a_step_with_a_non_finite_gradient_is_skipped(raw_tiny_model, caplog):
    """A NaN gradient (here from a NaN advantage) must not reach the weights: the step is
    skipped, counted and logged, and the update goes on from the weights it had."""
    learner = make_learner(raw_tiny_model, lr=1e-3, target_kl=1e9)
    batch = trajectories(learner.policy.tokenizer)
    nan_advantage = A.clone()
    nan_advantage[1] = float("nan")
    before = {name: p.detach().clone() for name, p in learner.policy.model.named_parameters()}
    with caplog.at_level("WARNING", logger="satseq.actors.learner.update"):
        result = learner.update(batch, learner.logprobs(batch), nan_advantage, torch.ones(4))
    assert result.skipped_steps == 1 and result.optimizer_steps == 0
    assert "optimiser step is skipped" in caplog.text
    for name, p in learner.policy.model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), max_size=30),
    max_rows=st.integers(1, 8),
    max_tokens=st.none() | st.integers(1, 200),
    padded=st.booleans(),
)
def test_micro_batch_parts_are_consecutive_within_both_caps_and_as_long_as_they_may_be(
    lengths, max_rows, max_tokens, padded
):
    def tokens(part):
        held = lengths[part.start : part.stop]
        return len(held) * max(held) if padded else sum(held)

    parts = micro_batch_parts(lengths, max_rows, max_tokens, padded)
    assert [i for part in parts for i in part] == list(range(len(lengths)))
    for k, part in enumerate(parts):
        assert 1 <= len(part) <= max_rows
        assert max_tokens is None or len(part) == 1 or tokens(part) <= max_tokens
        if k + 1 < len(parts) and len(part) < max_rows:  # the next trajectory did not fit
            assert tokens(range(part.start, part.stop + 1)) > max_tokens


def test_a_token_budget_counts_packed_trajectories_once_and_padded_rows_to_their_longest():
    lengths = [10, 2, 2, 2, 10]
    assert micro_batch_parts(lengths, 8, 16, padded=False) == [range(0, 4), range(4, 5)]
    assert micro_batch_parts(lengths, 8, 16, padded=True) == [range(0, 1), range(1, 4), range(4, 5)]
    assert micro_batch_parts(lengths, 2, None, padded=False) == [
        range(0, 2),
        range(2, 4),
        range(4, 5),
    ]
    assert micro_batch_parts([30, 5], 8, 16, padded=False) == [range(0, 1), range(1, 2)]  # alone
