"""An agent sharded over W = 2 learner ranks (FSDP2 on gloo, real Ray actors) computes what one
unsharded learner computes: log-probs, the update with backtracking (SAT-Seq) and without
(GRPO), its checkpoint and HF directory, and its weights in buckets."""

import dataclasses

import pytest
import ray
import torch

from satseq.actors.incarnation import ActorRestarted
from satseq.actors.learner import Learner, LearnerSpec, LossSpec, OptimizerSpec, TrustRegionSpec
from satseq.actors.learner.group import start_learner_group
from satseq.cluster.faults import RESTARTED_ACTOR
from satseq.models import load_tokenizer
from tests.actors.restarts import sigkill_until_restarted
from tests.actors.test_learner import trajectories

TOLERANCE = 1e-5


def five_trajectories(tokenizer):
    """Five rows at one micro-batch each: rank 0 takes three, rank 1 two and a stand-in."""
    rows = trajectories(tokenizer)
    return [*rows, dataclasses.replace(rows[0], prompt_index=4)]


SAT_SEQ = dict(  # a KL budget: step 1 backtracks twice then is accepted, step 2 is rejected
    trust_region=TrustRegionSpec(target_kl=0.03, max_backtracks=2, kl_coef=0.1),
    ppo_epochs=2,
)
GRPO = dict(
    trust_region=TrustRegionSpec(enabled=False, kl_estimator="k3"),
    loss=LossSpec(ratio="token", aggregation="token_mean"),
)


def spec(path, **overrides):
    return LearnerSpec(
        model_path=path,
        agent_index=0,
        micro_batch_size=1,
        optimizer=OptimizerSpec(lr=3e-2),
        **overrides,
    )


def close(a, b):
    return (a - b).abs().max().item() < TOLERANCE


@pytest.fixture
def group_of_two(ray_cluster):
    """Starts groups of two ranks (two at a time fit the 2-CPU cluster); kills them after."""
    groups = []

    def start(learner_spec, restarts=False):
        options = {"num_cpus": 0.5} | (RESTARTED_ACTOR if restarts else {})
        group = start_learner_group(learner_spec, [options, options])
        ray.get(group.ready.remote())
        groups.append(group)
        return group

    yield start
    for group in groups:
        for rank in group.ranks:
            ray.kill(rank, no_restart=True)


@pytest.mark.parametrize("recipe", [SAT_SEQ, GRPO], ids=["sat_seq", "grpo"])
def test_two_ranks_update_as_one_learner(raw_tiny_model, group_of_two, recipe):
    single = Learner(spec(raw_tiny_model, **recipe))
    group = group_of_two(spec(raw_tiny_model, **recipe))
    batch = five_trajectories(single.policy.tokenizer)
    A, c = torch.tensor([1.0, -0.5, 0.3, -1.0, 0.8]), torch.tensor([1.0, 0.9, 1.1, 1.0, 0.7])

    logp_cur = single.logprobs(batch)
    assert close(ray.get(group.logprobs.remote(batch)), logp_cur)
    behaviour = None if recipe is GRPO else logp_cur  # GRPO: π_old from the first forward
    expected = single.update(batch, behaviour, A, c)
    got = ray.get(group.update.remote(batch, behaviour, A, c))
    assert got.tokens == expected.tokens
    assert [s.decision for s in got.steps] == [s.decision for s in expected.steps]
    assert got.backtracks == expected.backtracks
    if recipe is SAT_SEQ:
        assert expected.backtracks >= 1  # the trust region restored the shards at least once
    assert got.loss == pytest.approx(expected.loss, abs=TOLERANCE)
    assert got.clip_fraction == pytest.approx(expected.clip_fraction, abs=TOLERANCE)
    assert got.kl_quantile == pytest.approx(expected.kl_quantile, rel=1e-4, abs=TOLERANCE)
    assert close(got.logp_hat, expected.logp_hat)
    assert not torch.equal(expected.logp_hat, logp_cur)  # the update moved the policy
    # the step itself: AdamW's first step is ~lr·sign(g), which magnifies float noise on
    # near-zero gradients, so it is compared by norm (a wrong loss scale is O(1) off)
    weights, initial = ray.get(group.weights.remote()), Learner(spec(raw_tiny_model)).weights()
    step = torch.cat([(t - initial[k]).flatten() for k, t in single.weights().items()])
    step_group = torch.cat([(weights[k] - initial[k]).flatten() for k in single.weights()])
    assert step.norm() > 0 and (step_group - step).norm() / step.norm() < 1e-4
    assert close(ray.get(group.logprobs.remote(batch)), single.logprobs(batch))
    rank_weights = ray.get([rank.weights.remote() for rank in group.ranks])  # a collective
    assert rank_weights[0].keys() == weights.keys() and rank_weights[1] == {}


def test_a_rank_restarted_between_calls_is_refused_until_the_group_forms_again(
    raw_tiny_model, group_of_two
):
    """Killed between calls, rank 1 comes back (Ray restarts it) outside the group: the next call
    fails at once with ActorRestarted, before rank 0 waits in a collective for it, and the
    group answers as before once `ready` has formed it again."""
    group = group_of_two(spec(raw_tiny_model), restarts=True)
    batch = five_trajectories(load_tokenizer(raw_tiny_model))
    before = ray.get(group.logprobs.remote(batch))
    rank = group.ranks[1]
    sigkill_until_restarted(rank)

    with pytest.raises(ActorRestarted) as refused:
        group.logprobs.remote(batch)
    assert refused.value.actor_id == rank._actor_id.hex()
    ray.get(group.ready.remote())
    assert close(ray.get(group.logprobs.remote(batch)), before)


def test_a_sharded_checkpoint_resumes_the_group_and_consolidates_to_hf(
    raw_tiny_model, group_of_two, tmp_path
):
    learner_spec = spec(raw_tiny_model, **SAT_SEQ)
    group = group_of_two(learner_spec)
    batch = five_trajectories(Learner(learner_spec).policy.tokenizer)
    A, c = torch.tensor([1.0, -0.5, 0.3, -1.0, 0.8]), torch.ones(5)

    def update(learners):
        logp = ray.get(learners.logprobs.remote(batch))
        return ray.get(learners.update.remote(batch, logp, A, c))

    update(group)
    path = str(tmp_path / "stage_0" / "learner_0.pt")
    ray.get(group.save_state.remote(path))
    assert sorted(p.name for p in (tmp_path / "stage_0").iterdir()) == ["learner_0.pt"]
    resumed = group_of_two(learner_spec)
    ray.get(resumed.load_state.remote(path))
    before = ray.get(resumed.weights.remote())
    assert all(torch.equal(before[k], v) for k, v in ray.get(group.weights.remote()).items())
    first, second = update(group), update(resumed)  # AdamW's moments and β came back too
    assert first.steps == second.steps and first.loss == second.loss
    after = ray.get(group.weights.remote())
    assert all(torch.equal(after[k], v) for k, v in ray.get(resumed.weights.remote()).items())

    hf = ray.get(group.save_pretrained.remote(str(tmp_path / "hf")))
    reloaded = Learner(spec(hf))
    assert all(torch.equal(after[k], v) for k, v in reloaded.weights().items())


def test_weight_buckets_hold_every_weight_once_and_keep_layers_whole(raw_tiny_model):
    learner = Learner(spec(raw_tiny_model))
    everything = learner.weights()
    layer_bytes = sum(
        t.nbytes for name, t in everything.items() if name.startswith("model.layers.0.")
    )
    buckets = list(learner.weight_buckets(bucket_mb=layer_bytes / 2**20))
    assert len(buckets) > 2
    merged = {name: t for bucket in buckets for name, t in bucket.items()}
    assert merged.keys() == everything.keys()
    assert sum(len(bucket) for bucket in buckets) == len(everything)
    assert all(torch.equal(merged[name], t) for name, t in everything.items())
    for layer in {name.split(".")[2] for name in everything if name.startswith("model.layers.")}:
        holding = [b for b in buckets if any(n.startswith(f"model.layers.{layer}.") for n in b)]
        assert len(holding) == 1, f"layer {layer} split over {len(holding)} buckets"
