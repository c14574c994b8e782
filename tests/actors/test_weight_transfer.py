"""A collective weight sync (`rollout.weight_sync: collective`, `satseq.actors.weight_transfer`).

On the CPU the collective is gloo; the engines take it through vLLM's weight-transfer API, as
GPU engines take NCCL. Checked: the wire format (every tensor arrives bit-exact, in buckets both
sides cut alike), a bad manifest fails loudly, and with real Ray actors and vLLM engines a
broadcast leaves the engines exactly as an object-store push of the same weights does (which
then changes nothing), and the group forms again after a rollout actor is killed.
"""

from __future__ import annotations

import threading

import pytest
import ray
import torch
from hypothesis import given
from hypothesis import strategies as st

from satseq.actors.calls import RayCalls
from satseq.actors.learner import LearnerSpec, OptimizerSpec
from satseq.actors.learner.actor import LearnerActor
from satseq.actors.learner.handle import ActorLearner
from satseq.actors.rollout import RolloutActor
from satseq.actors.sharding import free_address
from satseq.actors.trajectory import GenerationRequest, SamplingSpec, Trajectory
from satseq.actors.weight_transfer import (
    GlooGroup,
    TensorSpec,
    TransferEndpoint,
    WeightSender,
    bucket_plan,
    receive_buckets,
)
from satseq.cluster.runtime import TeamRuntime
from satseq.cluster.started_team import StartedTeam, SyncSettings
from satseq.data import DEFAULT_PROMPT_FORMAT
from satseq.models import load_tokenizer
from satseq.rewards import RewardScorer
from tests.actors.restarts import sigkill_until_restarted

WEIGHTS = {
    "embed.weight": torch.randn(7, 5).to(torch.bfloat16),
    "layers.0.scale": torch.randn(5),
    "layers.0.bias": torch.tensor(0.25),
    "layers.1.weight": torch.randn(3, 5, 2),
    "head.counts": torch.arange(6, dtype=torch.int64),
}


def manifest_of(weights: dict[str, torch.Tensor]) -> list[TensorSpec]:
    return [
        TensorSpec(name, str(t.dtype).removeprefix("torch."), tuple(t.shape))
        for name, t in weights.items()
    ]


def endpoint(world_size: int, bucket_bytes: int) -> TransferEndpoint:
    host, port = free_address().rsplit(":", 1)
    return TransferEndpoint(host, int(port), world_size, "gloo", bucket_bytes)


@given(
    sizes=st.lists(st.integers(1, 64), min_size=1, max_size=30),
    bucket_bytes=st.integers(1, 512),
)
def test_buckets_hold_every_weight_once_in_order_and_close_at_the_bucket_size(sizes, bucket_bytes):
    manifest = [TensorSpec(f"w{i}", "float32", (size,)) for i, size in enumerate(sizes)]
    plan = bucket_plan(manifest, bucket_bytes)
    assert [i for bucket in plan for i in bucket] == list(range(len(sizes)))
    for bucket in plan:
        nbytes = [manifest[i].nbytes for i in bucket]
        assert sum(nbytes[:-1]) < bucket_bytes  # still open before its last weight
    assert all(sum(manifest[i].nbytes for i in bucket) >= bucket_bytes for bucket in plan[:-1])


def test_a_tensor_spec_counts_the_bytes_of_its_dtype():
    assert TensorSpec("w", "bfloat16", (3, 4)).nbytes == 24
    assert TensorSpec("w", "float32", ()).nbytes == 4


@pytest.mark.parametrize("bucket_bytes", [1, 40, 1 << 20])
def test_every_tensor_arrives_bit_exact_in_the_senders_buckets(bucket_bytes):
    """Rank 0 sends over gloo, rank 1 (a thread here, an engine worker in a run) receives."""
    manifest = manifest_of(WEIGHTS)
    where = endpoint(2, bucket_bytes)
    received: list[list[tuple[str, torch.Tensor]]] = []

    def receive():
        group = GlooGroup(where.host, where.port, 1, 2)
        received.extend(receive_buckets(group, manifest, bucket_bytes))

    receiver = threading.Thread(target=receive)
    receiver.start()
    sender = WeightSender(where)
    sender.send(manifest, WEIGHTS.items())
    receiver.join(timeout=60)
    sender.close()

    assert len(received) == len(bucket_plan(manifest, bucket_bytes))
    got = dict(pair for bucket in received for pair in bucket)
    assert list(got) == list(WEIGHTS)
    for name, tensor in WEIGHTS.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({**WEIGHTS, "layers.1.weight": torch.randn(3, 5)}, "layers.1.weight"),
        (dict(list(WEIGHTS.items())[:-1]), "sent 4 weights, but the engines expect 5"),
        ({**WEIGHTS, "extra": torch.zeros(1)}, "'extra' is not in the manifest"),
    ],
)
def test_weights_that_disagree_with_the_manifest_fail_naming_the_weight(weights, message):
    sender = WeightSender(endpoint(1, 1 << 20))  # a group of the sender alone
    with pytest.raises(ValueError, match=message):
        sender.send(manifest_of(WEIGHTS), weights.items())
    sender.close()


# --- real actors: a learner and two rollout actors with vLLM engines ---------------------------

PROMPTS = ["Compute 12 + 7.", "Solve 3 * 4", "What is 25 + 17?"]
BUCKET_MB = 0.05  # the tiny model's float32 weights are ~0.6 MiB: a dozen buckets a push


@pytest.fixture(scope="module")
def team(ray_cluster, raw_tiny_model):
    """One learner and two rollout actors whose engines take the collective on gloo (restarted
    by Ray when killed, as in training); the same actors take object-store pushes too."""
    pytest.importorskip("vllm")
    spec = LearnerSpec(model_path=raw_tiny_model, agent_index=0, optimizer=OptimizerSpec(lr=1e-2))
    learner = LearnerActor.options(num_cpus=0).remote(spec)
    options = {"num_cpus": 0, "max_restarts": -1}
    rollouts = [
        RolloutActor.options(**options).remote(
            {"a0": raw_tiny_model}, "vllm", {"weight_transfer": "gloo"}, j
        )
        for j in range(2)
    ]
    ray.get([actor.ready.remote() for actor in rollouts] + [learner.ready.remote()])
    tokenizer = load_tokenizer(raw_tiny_model)

    def runtime(weight_transfer):
        team = StartedTeam(
            ["a0"],
            [raw_tiny_model],
            [raw_tiny_model],
            [tokenizer],
            [ActorLearner(learner)],
            rollouts,
        )
        sync = SyncSettings(bucket_mb=BUCKET_MB, weight_transfer=weight_transfer)
        return TeamRuntime(team, RayCalls(), DEFAULT_PROMPT_FORMAT, RewardScorer(), sync=sync)

    return {
        "learner": learner,
        "tokenizer": tokenizer,
        "rollouts": rollouts,
        "broadcast": runtime("gloo"),
        "object_store": runtime(None),
    }


def train_one_step(team) -> None:
    """Move the learner's weights: one AdamW step at lr 1e-2 on two scored answers."""
    tokenizer = team["tokenizer"]
    trajectories = []
    for i, (prompt, answer) in enumerate(zip(PROMPTS[:2], [" 19", " 12"], strict=True)):
        response = tokenizer.encode(answer, add_special_tokens=False)
        n = len(response)
        trajectories.append(
            Trajectory(i, tokenizer.encode(prompt), response, [1] * n, [0] * n, "stop")
        )
    ray.get(
        team["learner"].update.remote(trajectories, None, torch.tensor([1.0, -1.0]), torch.ones(2))
    )


def greedy_samples(actor, tokenizer) -> list[tuple[list[int], float]]:
    """Each prompt's greedy continuation and its summed log-prob at temperature 1."""
    requests = [GenerationRequest("a0", tokenizer.encode(p), 1) for p in PROMPTS]
    spec = SamplingSpec(temperature=0.0, max_new_tokens=12, logprobs=True)
    samples = ray.get(actor.generate.remote(requests, spec))
    return [(s.token_ids, s.logprob) for (s,) in samples]


def learner_logprob(team, prompt_ids: list[int], response: list[int]) -> float:
    n = len(response)
    trajectory = Trajectory(0, prompt_ids, response, [1] * n, [0] * n, "stop")
    return float(ray.get(team["learner"].logprobs.remote([trajectory]))[0, :n].sum())


@pytest.mark.slow
def test_a_broadcast_leaves_every_engine_as_an_object_store_push_does(team):
    tokenizer, rollouts = team["tokenizer"], team["rollouts"]
    before = greedy_samples(rollouts[0], tokenizer)
    train_one_step(team)
    team["broadcast"].weight_sync.push(0)
    manifest = team["broadcast"].weight_sync.manifests[0]
    assert len(bucket_plan(manifest, int(BUCKET_MB * 2**20))) > 2  # several buckets
    broadcast = [greedy_samples(actor, tokenizer) for actor in rollouts]
    assert broadcast[0] == broadcast[1] != before  # both engines took the step

    team["object_store"].weight_sync.push(0)  # the same weights, the other path
    assert [greedy_samples(actor, tokenizer) for actor in rollouts] == broadcast  # bit-identical
    for prompt, (tokens, logprob) in zip(PROMPTS, broadcast[0], strict=True):
        expected = learner_logprob(team, tokenizer.encode(prompt), tokens)
        assert logprob == pytest.approx(expected, abs=1e-4)
    assert team["broadcast"].weight_sync.take_seconds() > 0


@pytest.mark.slow
def test_after_a_rollout_actor_is_killed_the_next_push_forms_the_group_again(team):
    tokenizer, rollouts, runtime = team["tokenizer"], team["rollouts"], team["broadcast"]
    sigkill_until_restarted(rollouts[1])
    runtime.weight_sync.forget()  # what the coordinator does after a loss

    train_one_step(team)
    runtime.weight_sync.push(0)
    broadcast = [greedy_samples(actor, tokenizer) for actor in rollouts]  # the restarted one too
    team["object_store"].weight_sync.push(0)
    assert [greedy_samples(actor, tokenizer) for actor in rollouts] == broadcast
