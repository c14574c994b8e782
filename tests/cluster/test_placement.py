"""How many torch threads each learner gets from where the team's bundles were placed."""

from satseq.cluster.placement import learner_threads


def test_a_lone_learner_takes_the_rollout_actors_cpus_on_its_node():
    # configs/smollm2_grpo.yaml on 2 cores: the learner and one rollout actor, 1 CPU each
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
