"""The rollout worker routes requests to its agents' engines, in-process and as a Ray actor."""

from __future__ import annotations

from dataclasses import replace

import pytest
import ray
import torch

from satseq.actors.rollout import RolloutActor, RolloutWorker
from satseq.actors.trajectory import SamplingSpec
from satseq.models import load_policy

SPEC = SamplingSpec(temperature=1.0, max_new_tokens=6, seed=7)
GREEDY = SamplingSpec(temperature=0.0, max_new_tokens=6)


@pytest.fixture(scope="module")
def tokenizer(raw_tiny_model):
    return load_policy(raw_tiny_model, "float32")[1]


@pytest.fixture(scope="module")
def worker(raw_tiny_model):
    worker = RolloutWorker({"a": raw_tiny_model, "b": raw_tiny_model}, engine="hf", seed=0)
    yield worker
    worker.close()


def requests(tokenizer):
    """Two agents, mixed sample counts, interleaved: results must come back in this order."""
    prompt, other = (tokenizer.encode(t, add_special_tokens=False) for t in ("1+2=", "Hi"))
    return [("a", prompt, 2), ("b", prompt, 1), ("a", other, 1), ("a", other, 2)]


def moved_weights(path, seed):
    """The model at `path` after a seeded step of noise: what a learner pushes after training."""
    model, _ = load_policy(path, "float32")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model.state_dict()


def test_requests_are_answered_in_order_with_n_samples_each(worker, tokenizer):
    result = worker.generate(requests(tokenizer), SPEC)
    assert [len(samples) for samples in result] == [2, 1, 1, 2]
    assert worker.generate(requests(tokenizer), SPEC) == result
    # Both agents hold the same checkpoint, yet draw different samples, seeded or not.
    prompt = requests(tokenizer)[0][1]
    for spec in (SPEC, replace(SPEC, seed=None)):
        from_a, from_b = worker.generate([("a", prompt, 1), ("b", prompt, 1)], spec)
        assert from_a != from_b
    with pytest.raises(KeyError, match="no agent 'c'"):
        worker.generate([("c", [1, 2], 1)], SPEC)


@pytest.mark.slow
def test_ray_actor_generates_and_loads_weights_like_the_in_process_worker(
    ray_cluster, worker, tokenizer, raw_tiny_model
):
    actor = RolloutActor.options(name="rollout-test").remote(
        {"a": raw_tiny_model, "b": raw_tiny_model}, "hf", {}, 0
    )
    try:
        assert ray.get(actor.ready.remote(), timeout=120) == {"engine": "hf", "agents": ["a", "b"]}
        assert ray.get_actor("rollout-test") is not None
        assert ray.get(actor.generate.remote(requests(tokenizer), SPEC), timeout=60) == (
            worker.generate(requests(tokenizer), SPEC)
        )

        greedy_a = [("a", prompt, 1) for _, prompt, _ in requests(tokenizer)]
        before = ray.get(actor.generate.remote(greedy_a, GREEDY), timeout=60)
        weights = moved_weights(raw_tiny_model, seed=1)
        ray.get(actor.load_weights.remote("a", weights), timeout=60)
        worker.load_weights("a", weights)
        after = ray.get(actor.generate.remote(greedy_a, GREEDY), timeout=60)

        assert after == worker.generate(greedy_a, GREEDY)
        assert after != before
    finally:
        ray.kill(actor)
