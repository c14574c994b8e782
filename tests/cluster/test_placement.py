"""How many torch threads each learner gets from where the team's bundles were placed, how
many learner ranks each agent has, and which path weights take to the engines."""

import pytest

from satseq.actors.learner import LossSpec, TrustRegionSpec
from satseq.cluster.learner_specs import (
    LearnerSettings,
    learner_hosts,
    learner_spec,
)
from satseq.cluster.placement import TeamPlacement, agent_bundles, learner_threads
from satseq.config import QUICKSTART, load_config
from satseq.launch.agent_models import agent_model_dirs


def test_a_lone_learner_takes_the_rollout_actors_cpus_on_its_node():
    # one learner and one rollout actor on 2 cores, 1 CPU each (bench_grpo_trl's SmolLM2 run)
    assert learner_threads([1.0, 1.0], ["node"] * 2, n_learners=1) == [2]
    # two rollout actors at half a core each
    assert learner_threads([1.0, 0.5, 0.5], ["node"] * 3, n_learners=1) == [2]


def test_learners_on_one_node_share_its_cpus():
    # the quickstart: three learners and a rollout actor at half a core each, 2 cores
    assert learner_threads([0.5] * 4, ["node"] * 4, n_learners=3) == [1, 1, 1]
    assert learner_threads([2.0, 2.0, 4.0], ["node"] * 3, n_learners=2) == [4, 4]


def test_only_cpus_on_the_learners_own_node_count():
    # learners on a GPU node, the rollout actor on another node
    assert learner_threads([4.0, 4.0, 8.0], ["gpu", "gpu", "cpu"], n_learners=2) == [4, 4]
    # one learner beside the rollout actor, one alone
    assert learner_threads([1.0, 1.0, 2.0], ["a", "b", "a"], n_learners=2) == [3, 1]


def test_an_agent_takes_its_own_workers_or_the_trainers():
    config = load_config(
        QUICKSTART,
        ["trainer.workers_per_agent=2", "team.agents.1.workers=4"],
    )
    assert [agent.workers for agent in config.plan.agents] == [2, 4, 2]
    settings = LearnerSettings(LossSpec(), TrustRegionSpec())
    specs = [learner_spec(config, i, settings, "cpu", 1) for i in range(3)]
    assert [spec.workers for spec in specs] == [2, 4, 2]


@pytest.mark.parametrize(
    ("overrides", "hosts"),
    [
        ([], [[0, 1, 2]]),  # one base: one process
        (["team.agents.1.lora=false"], [[0, 2], [1]]),  # a full agent has its own
        (["team.agents.2.path=builtin:tiny-carry-1"], [[0, 1], [2]]),  # another base
        (["trainer.share_lora_learners=false"], [[0], [1], [2]]),
    ],
)
def test_the_lora_agents_of_one_base_share_a_learner_process(builtin_models, overrides, hosts):
    one_base = [f"team.agents.{i}.path=builtin:tiny-carry-0" for i in (1, 2)]
    config = load_config(QUICKSTART, ["trainer.lora.rank=8", *one_base, *overrides])
    assert learner_hosts(config.plan, agent_model_dirs(config)) == hosts
    full = load_config(QUICKSTART, one_base)
    assert learner_hosts(full.plan, agent_model_dirs(full)) == [[0], [1], [2]]


def test_the_agents_of_one_process_share_its_bundle_and_a_sharded_agent_has_one_a_rank():
    assert agent_bundles([[0, 2], [1]], [1, 1, 1]) == [[0], [1], [0]]
    assert agent_bundles([[0, 1], [2]], [1, 1, 3]) == [[0], [0], [1, 2, 3]]
    assert agent_bundles([[0], [1]], [2, 1]) == [[0, 1], [2]]
    placement = TeamPlacement(None, agent_bundles([[0, 1, 2]], [1, 1, 1]), 0.0, 0.0)
    assert placement.n_learners == 1  # the rollout actors' bundles start at 1


@pytest.mark.parametrize(
    ("overrides", "learner_gpus", "rollout_gpus", "path"),
    [
        ([], 1.0, 1.0, None),  # the hf engine: object store
        (["rollout.engine=vllm"], 1.0, 1.0, "nccl"),  # auto: GPUs of their own
        (["rollout.engine=vllm"], 0.5, 0.5, None),  # one GPU shared: not a NCCL group
        (["rollout.engine=vllm"], 0.0, 0.0, None),  # auto stays off the CPU
        (["rollout.engine=vllm", "trainer.offload=idle_agents"], 1.0, 1.0, None),  # sleeping
        (["rollout.engine=vllm", "rollout.weight_sync=object_store"], 1.0, 1.0, None),
        (["rollout.engine=vllm", "rollout.weight_sync=collective"], 0.0, 0.0, "gloo"),
        (["rollout.engine=vllm", "rollout.weight_sync=collective"], 1.0, 2.0, "nccl"),
    ],
)
def test_the_weight_sync_path_follows_the_engine_and_the_devices(
    overrides, learner_gpus, rollout_gpus, path
):
    plan = load_config(QUICKSTART, overrides).plan
    assert plan.weight_transfer(learner_gpus, rollout_gpus) == path


def test_a_collective_sync_between_a_gpu_and_the_cpu_says_what_to_change():
    plan = load_config(QUICKSTART, ["rollout.engine=vllm", "rollout.weight_sync=collective"]).plan
    with pytest.raises(ValueError, match=r"GPUs of their own or both on the CPU.*object_store"):
        plan.weight_transfer(1.0, 0.0)
    with pytest.raises(ValueError, match="GPUs of their own"):
        plan.weight_transfer(0.5, 0.5)
