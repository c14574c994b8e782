"""The LoRA learners of one base in one process (`LearnerHost`, design §12): each hosted
learner steps, saves and resumes exactly as it would alone (its own random stream), and on Ray
each agent's `HostedLearner` is called as its own learner actor would be: calls, streamed
weights, the actor fault handling watches, a swap in place, and a team's swap on Ray
(`satseq.cluster.team.RayLearners`)."""

import dataclasses

import pytest
import torch

from satseq.actors.calls import RayCalls
from satseq.actors.learner import Learner, LearnerSpec, OptimizerSpec, TrustRegionSpec
from satseq.actors.learner.actor import LearnerHostActor
from satseq.actors.learner.host import HostedLearner, LearnerHost
from satseq.algo.masks import NO_OWNER
from satseq.cluster.recipes import RECIPES
from satseq.cluster.recipes.base import stage_sampling_spec
from satseq.cluster.swap import swap_agent
from satseq.cluster.team import start_on_ray
from satseq.cluster.training_data import training_problems
from satseq.config import QUICKSTART, load_config
from satseq.config.team import SwapConfig
from satseq.models import is_adapter_dir, resolve_model_path
from satseq.models.adapters import LoraSpec, initial_adapter
from tests.actors.test_learner import trajectories

A = torch.tensor([1.0, -1.0, 1.0, -1.0])
ONES = torch.ones(4)


@pytest.fixture(scope="module")
def specs(raw_tiny_model, tmp_path_factory) -> list[LearnerSpec]:
    """Two LoRA agents on the tiny base (ranks 4 and 8), one optimiser step a trajectory in a
    shuffled order: every update draws from the learner's random stream."""
    cache = tmp_path_factory.mktemp("adapters")
    return [
        LearnerSpec(
            model_path=str(initial_adapter(raw_tiny_model, LoraSpec(rank, 2.0 * rank), i, cache)),
            agent_index=i,
            seed=100 + i,
            micro_batch_size=4,
            mini_batch_size=1,
            optimizer=OptimizerSpec(lr=1e-2),
            trust_region=TrustRegionSpec(target_kl=10.0, max_backtracks=1),
        )
        for i, rank in enumerate((4, 8))
    ]


def batch_of(agent: int, learner: Learner) -> list:
    """Four trajectories that agent `agent` answered."""
    return trajectories(learner.policy.tokenizer, (agent,) * 4)


def test_hosted_learners_step_and_save_as_each_would_alone(specs, tmp_path):
    host = LearnerHost(specs)
    batches = [batch_of(i, host.learners[i]) for i in (0, 1)]
    host.call(0, "update", batches[0], None, A, ONES)
    host.call(1, "update", batches[1], None, A, ONES)  # between agent 0's two updates
    host.call(0, "update", batches[0], None, A, ONES)
    hosted = [host.call(i, "save_state", str(tmp_path / f"hosted{i}.pt")) for i in (0, 1)]

    for i, updates in ((0, 2), (1, 1)):  # each alone: nothing else draws from its stream
        alone = Learner(specs[i])
        for _ in range(updates):
            alone.update(batches[i], None, A, ONES)
        expected = torch.load(alone.save_state(str(tmp_path / f"alone{i}.pt")), weights_only=False)
        got = torch.load(hosted[i], weights_only=False)
        assert torch.equal(got["rng"], expected["rng"])
        assert set(got["model"]) == set(expected["model"])
        assert all(torch.equal(got["model"][k], v) for k, v in expected["model"].items())


def base_storages(learner: Learner) -> dict[str, int]:
    """Where each frozen base weight's memory is, by its base's name."""
    return {
        name.replace(".base_layer.", "."): param.untyped_storage().data_ptr()
        for name, param in learner.policy.model.named_parameters()
        if not param.requires_grad
    }


def test_the_hosted_lora_learners_of_one_base_hold_one_copy_of_it(specs, raw_tiny_model):
    full = dataclasses.replace(specs[0], model_path=raw_tiny_model, agent_index=2)
    host = LearnerHost([*specs, full])
    first = base_storages(host.learners[0])
    assert len(first) == 26 and base_storages(host.learners[1]) == first  # ranks 4 and 8
    assert base_storages(host.learners[2]) == {}  # a full model trains every weight
    full_weights = {
        p.untyped_storage().data_ptr() for p in host.learners[2].policy.trainable_parameters()
    }
    assert not full_weights & set(first.values())
    host.call(1, "reset")  # a new model: it shares the base again
    assert base_storages(host.learners[1]) == first


def test_a_hosted_learner_is_called_on_ray_as_its_own_actor(ray_cluster, specs):
    host = LearnerHostActor.remote(specs)
    handles = [HostedLearner(host, i) for i in (0, 1)]
    calls = RayCalls()
    assert calls.wait([h.ready.remote() for h in handles]) == [True, True]
    assert [h.actors for h in handles] == [[host], [host]]  # what faults watch
    alone = Learner(specs[1])
    batch = batch_of(1, alone)
    (logp,) = calls.wait([calls.start(handles[1], Learner.logprobs, batch)])
    assert torch.equal(logp, alone.logprobs(batch))

    streamed = {}  # the push's path: a streaming call through the host
    for ref in calls.stream(handles[1], Learner.weight_buckets, 64.0):
        streamed |= calls.wait([ref])[0]
    expected = alone.weights()
    assert set(streamed) == set(expected)
    assert all(torch.equal(streamed[k], v) for k, v in expected.items())

    # a swap in place: agent 0 leaves the host and its successor (rank 8) takes its index
    calls.wait([host.drop.remote(0)])
    swapped = dataclasses.replace(specs[1], agent_index=0)
    calls.wait([host.add.remote(swapped)])
    weights = calls.wait([calls.start(handles[0], Learner.weights)])[0]
    assert {tuple(t.shape) for k, t in weights.items() if "lora_A" in k} == {
        tuple(t.shape) for k, t in expected.items() if "lora_A" in k
    }
    assert (
        calls.wait([handles[1].incarnation.remote(), host.incarnation.remote()])[0]
        == (calls.wait([host.incarnation.remote()])[0])
    )


def test_the_team_on_ray_swaps_a_hosted_agent_for_a_full_model_and_back(
    ray_cluster, builtin_models, tmp_path
):
    """`RayLearners`, as `satseq train` starts them: two LoRA agents of one base share a host
    actor; a swap gives agent a1 a full model in that host, then an adapter again, and the
    engines answer as agent a1 on each."""
    model = load_config(QUICKSTART).team.agents[0].path
    agents = f"[{{name: a0, path: '{model}'}}, {{name: a1, path: '{model}'}}]"
    overrides = [f"team.agents={agents}", "trainer.lora.rank=8", "trainer.batch_size=2"]
    config = load_config(QUICKSTART, [*overrides, "rollout.max_new_tokens=16"])
    runtime = start_on_ray(config, RECIPES["sat_seq"].learner_settings(config))
    host = runtime.team.learners[0].host
    assert [learner.host for learner in runtime.team.learners] == [host, host]
    problems = training_problems(config)[:2]
    a0_adapter = runtime.call_learner(0, Learner.save_pretrained, str(tmp_path / "a0"))
    for path, lora in ((str(resolve_model_path(model)), False), (a0_adapter, True)):
        swap = SwapConfig(
            agent="a1", path=path, at_stage=0, delta0=10.0, max_steps=2, samples_per_prompt=1
        )
        metrics = swap_agent(runtime, config, swap, problems, 0, tmp_path / "swaps")
        assert metrics["swap/a1/swapped"] == 1
        assert runtime.team.learners[1].host == host  # its predecessor's place in the host
        assert is_adapter_dir(runtime.team.model_dirs[1]) == lora
        weights = runtime.call_learner(1, Learner.weights)
        assert all((".lora_" in name) == lora for name in weights)
    (sample,) = runtime.sample(problems[:1], [[1]], stage_sampling_spec(config, 0))
    assert sample.response_ids and set(sample.owner_ids) <= {1, NO_OWNER}
