"""LoRA agents on a shared engine (design §12), for both engines: the LoRA agents on one base
are one engine; a push after an update changes that agent's adapter only, to the learner's
log-probs; an engine never serves an older version of an adapter after a push; a rollout worker
samples every LoRA agent in one call and swaps an agent between adapters and full models. With
merged engines (`rollout.lora_engines: merged`) each LoRA agent has a full engine of its own,
whose log-probs after a push are the learner's too."""

from pathlib import Path

import pytest
import torch

from satseq.actors.engines.lora import LoraAgentEngine, team_engines
from satseq.actors.engines.merged_lora import MergedLoraEngine, merge_scale, merged_weights
from satseq.actors.learner import Learner, LearnerSpec, OptimizerSpec, TrustRegionSpec
from satseq.actors.rollout import RolloutWorker
from satseq.actors.trajectory import GenerationRequest, SamplingSpec
from satseq.models.adapters import LoraSpec, initial_adapter
from tests.actors.test_learner import trajectories

KINDS = ["hf", pytest.param("vllm", marks=pytest.mark.slow)]
AGENTS = ("a", "b")
GREEDY = SamplingSpec(temperature=0.0, max_new_tokens=8)


@pytest.fixture(scope="module")
def adapters(raw_tiny_model, tmp_path_factory):
    cache = tmp_path_factory.mktemp("adapters")
    return {
        name: str(initial_adapter(raw_tiny_model, LoraSpec(8, 16.0), k, cache))
        for k, name in enumerate(AGENTS)
    }


@pytest.fixture(scope="module")
def engines(adapters, raw_tiny_model):
    """engines(kind): the team a, b (LoRA) and full, started on first use, kept per module."""
    started = {}

    def get(kind):
        if kind not in started:
            paths = {**adapters, "full": raw_tiny_model}
            started[kind] = team_engines(kind, paths, {"a": 0, "b": 1, "full": 2}, {})
        return started[kind]

    yield get
    for team in started.values():
        for engine in team.values():
            engine.close()


@pytest.fixture(scope="module")
def learner(adapters):
    spec = LearnerSpec(
        model_path=adapters["a"],
        agent_index=0,
        micro_batch_size=4,
        optimizer=OptimizerSpec(lr=1e-2),
        trust_region=TrustRegionSpec(target_kl=100.0),
    )
    return Learner(spec)


def scored(engine, batch):
    sequences = [t.prompt_ids + t.response_ids for t in batch]
    return engine.prompt_logprobs(sequences, [len(t.prompt_ids) for t in batch])


def max_gap(engine_logprobs, learner_logprobs) -> float:
    return max(
        abs(x - y)
        for row, values in enumerate(engine_logprobs)
        for x, y in zip(values, learner_logprobs[row, : len(values)].tolist(), strict=True)
    )


def update_and_push(learner, engine, batch, advantages):
    learner.update(batch, learner.logprobs(batch), advantages, torch.ones(len(batch)))
    for bucket in learner.weight_buckets(512.0):
        engine.load_weights(bucket)
    return learner.logprobs(batch)


@pytest.mark.parametrize("kind", KINDS)
def test_lora_agents_share_one_engine_and_a_push_moves_one_adapter_to_the_learner(
    kind, engines, learner
):
    team = engines(kind)
    a, b, full = team["a"], team["b"], team["full"]
    assert isinstance(a, LoraAgentEngine) and a.shared is b.shared
    assert not isinstance(full, LoraAgentEngine)
    batch = trajectories(learner.policy.tokenizer)
    for bucket in learner.weight_buckets(512.0):  # in step with the learner, whatever it did
        a.load_weights(bucket)
    before = {name: scored(engine, batch) for name, engine in team.items()}
    assert max_gap(before["a"], learner.logprobs(batch)) < 1e-4
    expected = update_and_push(learner, a, batch, torch.tensor([1.0, -1.0, 1.0, -1.0]))
    assert max_gap(scored(a, batch), expected) < 1e-4  # the learner's log-probs, both engines
    assert max_gap(before["a"], expected) > 1e-1, "the update moved nothing"
    assert scored(b, batch) == before["b"] and scored(full, batch) == before["full"]


@pytest.mark.slow
def test_vllm_never_serves_an_older_adapter_after_a_push(engines, learner):
    """Each push is a new adapter version (a new id): the old one leaves the engine, so every
    later request, log-probs and generation alike, reads the new weights."""
    team, reference = engines("vllm"), engines("hf")
    batch = trajectories(learner.policy.tokenizer)
    prompts = [t.prompt_ids for t in batch]
    for advantages in ([-1.0, 1.0, -1.0, 1.0], [1.0, 1.0, -1.0, -1.0]):
        old_id = team["a"].shared.engine.lora.request("a").lora_int_id
        expected = update_and_push(learner, team["a"], batch, torch.tensor(advantages))
        reference["a"].load_weights(learner.weights())
        new_id = team["a"].shared.engine.lora.request("a").lora_int_id
        loaded = team["a"].shared.engine.llm.llm_engine.list_loras()
        assert new_id != old_id and old_id not in loaded and new_id in loaded
        assert max_gap(scored(team["a"], batch), expected) < 1e-4
        greedy = [s[0].token_ids for s in team["a"].generate(prompts, GREEDY)]
        assert greedy == [s[0].token_ids for s in reference["a"].generate(prompts, GREEDY)]


@pytest.mark.slow
def test_a_vllm_push_hands_its_tensors_to_the_engine_which_leaves_them_as_they_were(
    engines, learner
):
    """No file holds a pushed version's tensors (its directory: the config alone); vLLM scales
    an adapter's B in place, so it must work on copies: the tensors kept for the next push are
    the learner's, unscaled, and the engine's log-probs are the learner's."""
    team = engines("vllm")
    adapters = team["a"].shared.engine.lora
    assert adapters.in_memory, "this vLLM's worker took no in-memory adapter class"
    batch = trajectories(learner.policy.tokenizer)
    expected = update_and_push(learner, team["a"], batch, torch.tensor([1.0, 1.0, -1.0, 1.0]))
    installed = adapters.installed["a"]
    assert sorted(p.name for p in Path(installed.request.lora_path).iterdir()) == [
        "adapter_config.json"
    ]
    weights = learner.weights()
    assert installed.tensors.keys() == weights.keys()
    assert all(torch.equal(installed.tensors[name], weights[name]) for name in weights)
    assert max_gap(scored(team["a"], batch), expected) < 1e-4


@pytest.fixture(scope="module")
def worker(adapters, raw_tiny_model):
    worker = RolloutWorker({**adapters, "full": raw_tiny_model}, "hf", seed=0)
    yield worker
    worker.close()


def test_a_worker_samples_its_lora_agents_in_one_engine_call_in_request_order(worker):
    shared = worker.engines["a"].shared
    calls = []
    generate = shared.engine.generate
    shared.engine.generate = lambda *args, **kw: (
        calls.append(kw["adapters"]) or generate(*args, **kw)
    )
    prompts = [[5, 6, 7], [8, 9, 10]]
    requests = [GenerationRequest("b", prompts[0], 1), GenerationRequest("full", prompts[0], 1)]
    requests.append(GenerationRequest("a", prompts[1], 1))
    try:
        samples = worker.generate(requests, GREEDY)
    finally:
        del shared.engine.generate
    assert calls == [["b", "a"]]  # one call, each prompt with its agent's adapter
    assert samples[0] == worker.engines["b"].generate([prompts[0]], GREEDY)[0]
    assert samples[2] == worker.engines["a"].generate([prompts[1]], GREEDY)[0]
    assert worker.sleep() == {"a": "noop:hf", "b": "noop:hf", "full": "noop:hf"}
    worker.wake_up()


def test_a_swap_moves_a_lora_agent_to_a_full_model_and_back_to_an_adapter(
    worker, adapters, raw_tiny_model
):
    shared = worker.engines["a"].shared
    worker.replace_agent("b", raw_tiny_model)  # b leaves the shared engine
    assert not isinstance(worker.engines["b"], LoraAgentEngine)
    assert shared.agents == {"a"} and set(shared.engine.peft.peft_config) == {"a"}
    worker.replace_agent("b", adapters["b"])  # and joins it again
    assert worker.engines["b"].shared is shared and shared.agents == {"a", "b"}
    batch = [[5, 6, 7, 8, 9]]
    expected = worker.engines["a"].prompt_logprobs(batch, [2])  # same base, B = 0: equal
    assert worker.engines["b"].prompt_logprobs(batch, [2])[0] == pytest.approx(expected[0])


# --- merged LoRA engines (rollout.lora_engines: merged) ----------------------------------------


def test_a_merge_adds_the_scaled_product_of_b_and_a_to_each_adapted_weight_only():
    """By hand: W = 1 (2×2), A = [[1, 2]] (r = 1), B = [[1], [0]], s = 2: W + s·B·A =
    [[3, 5], [1, 1]]; the other weight is the base's; a module the base lacks is named."""
    base = {"model.q.weight": torch.ones(2, 2), "model.norm.weight": torch.ones(2)}
    adapter = {
        "base_model.model.model.q.lora_A.weight": torch.tensor([[1.0, 2.0]]),
        "base_model.model.model.q.lora_B.weight": torch.tensor([[1.0], [0.0]]),
    }
    merged = merged_weights(base, adapter, 2.0)
    assert torch.equal(merged["model.q.weight"], torch.tensor([[3.0, 5.0], [1.0, 1.0]]))
    assert merged["model.norm.weight"] is base["model.norm.weight"]
    assert torch.equal(base["model.q.weight"], torch.ones(2, 2))  # the base kept as it was
    renamed = {name.replace(".q.", ".k."): t for name, t in adapter.items()}
    with pytest.raises(KeyError, match=r"model\.k"):
        merged_weights(base, renamed, 2.0)


def test_the_merge_scale_is_peft_s_and_an_adapter_it_cannot_merge_is_refused():
    assert merge_scale({"r": 8, "lora_alpha": 16.0}, "a") == 2.0
    assert merge_scale({"r": 16, "lora_alpha": 16.0, "use_rslora": True}, "a") == 4.0
    assert merge_scale({"r": 8, "lora_alpha": 16, "use_dora": False, "rank_pattern": {}}, "a")
    with pytest.raises(ValueError, match=r"use_dora=True.*lora_engines: shared"):
        merge_scale({"r": 8, "lora_alpha": 16.0, "use_dora": True}, "a")
    with pytest.raises(ValueError, match="rank_pattern"):
        merge_scale({"r": 8, "lora_alpha": 16.0, "rank_pattern": {"q_proj": 4}}, "a")


@pytest.mark.parametrize("kind", KINDS)
def test_merged_engines_are_one_per_lora_agent_and_a_push_brings_the_learners_logprobs(
    kind, adapters, raw_tiny_model
):
    """Each LoRA agent on an engine of its own, its adapter merged into the base; after an
    update, a push of the adapter's tensors gives the learner's log-probs, and the other
    agent's engine is untouched."""
    spec = LearnerSpec(
        model_path=adapters["a"],
        agent_index=0,
        micro_batch_size=4,
        optimizer=OptimizerSpec(lr=1e-2),
        trust_region=TrustRegionSpec(target_kl=100.0),
    )
    learner = Learner(spec)
    paths = {**adapters, "full": raw_tiny_model}
    team = team_engines(kind, paths, {"a": 0, "b": 1, "full": 2}, {"lora_engines": "merged"})
    try:
        assert isinstance(team["a"], MergedLoraEngine) and isinstance(team["b"], MergedLoraEngine)
        assert team["a"].engine is not team["b"].engine
        batch = trajectories(learner.policy.tokenizer)
        before = {name: scored(engine, batch) for name, engine in team.items()}
        assert max_gap(before["a"], learner.logprobs(batch)) < 1e-4
        expected = update_and_push(learner, team["a"], batch, torch.tensor([1.0, -1.0, 1.0, -1.0]))
        assert max_gap(scored(team["a"], batch), expected) < 1e-4
        assert max_gap(before["a"], expected) > 1e-1, "the update moved nothing"
        assert scored(team["b"], batch) == before["b"]
        assert scored(team["full"], batch) == before["full"]
    finally:
        for engine in team.values():
            engine.close()


def test_a_swap_with_merged_engines_gives_the_incoming_adapter_an_engine_of_its_own(
    adapters, raw_tiny_model
):
    worker = RolloutWorker(
        {**adapters, "full": raw_tiny_model}, "hf", {"lora_engines": "merged"}, seed=0
    )
    try:
        worker.replace_agent("full", adapters["b"])
        assert isinstance(worker.engines["full"], MergedLoraEngine)
        batch = [[5, 6, 7, 8, 9]]
        expected = worker.engines["b"].prompt_logprobs(batch, [2])  # the same adapter
        assert worker.engines["full"].prompt_logprobs(batch, [2])[0] == pytest.approx(expected[0])
    finally:
        worker.close()
