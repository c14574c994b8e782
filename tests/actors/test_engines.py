"""Rollout engines: weight sync matches the learner exactly, and the generation contract holds
(n samples, finish reasons, stop strings, seeds) for both the hf and the vllm engine."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from satseq.actors.engines import make_engine
from satseq.actors.engines.base import (
    GREEDY_BELOW_TEMPERATURE,
    check_generate_request,
    check_logprob_request,
)
from satseq.actors.forward import PolicyTrunk, response_logprobs
from satseq.actors.trajectory import Generation, SamplingSpec, Trajectory, pad_batch
from satseq.models import load_policy

# vLLM takes a few seconds to import and start, so its cases are `slow`.
KINDS = ["hf", pytest.param("vllm", marks=pytest.mark.slow)]
TEXTS = [("Compute 12 + 7.", " 12 + 7 = 19, so \\boxed{19}."), ("Solve 3 * 4", " = 12")]


@pytest.fixture(scope="module")
def model_paths(raw_tiny_model, tmp_path_factory):
    """The tiny model as built (tied embeddings, as Qwen2's small models) and an untied copy."""
    model, tokenizer = load_policy(raw_tiny_model, "float32")
    config = model.config
    config.tie_word_embeddings = False
    untied = AutoModelForCausalLM.from_config(config)
    untied.load_state_dict(model.state_dict())
    out = tmp_path_factory.mktemp("untied")
    untied.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"tied": raw_tiny_model, "untied": str(out)}


@pytest.fixture(scope="module")
def engines(model_paths):
    """engines(kind, tying) starts that engine on first use and keeps it for the module."""
    started = {}

    def get(kind, tying="tied"):
        if kind == "vllm":
            pytest.importorskip("vllm")
        if (kind, tying) not in started:
            started[(kind, tying)] = make_engine(kind, model_paths[tying], seed=0)
        return started[(kind, tying)]

    yield get
    for engine in started.values():
        engine.close()


@pytest.fixture(scope="module")
def tokenizer(raw_tiny_model):
    return load_policy(raw_tiny_model, "float32")[1]


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def perturb_(model, seed, scale=0.05):
    """Add seeded noise to every parameter in place, as a few SGD steps would move them."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():  # a tied embedding is one parameter: moved once
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


def greedy_continuation(model, eos_token_id, prompt, steps):
    """Argmax decoding with full forward passes: the learner's own view of greedy output."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            if ids[-1] == eos_token_id:
                break
    return ids[len(prompt) :]


def engine_logprobs(engine, sequences, starts, temperature):
    """The engine's log-probs of every scored token, flattened in sequence order."""
    scores = engine.prompt_logprobs(sequences, starts, temperature)
    return torch.tensor([logprob for sequence in scores for logprob in sequence])


def trajectory(index, prompt_ids, response_ids):
    n = len(response_ids)
    return Trajectory(index, prompt_ids, response_ids, [1] * n, [0] * n, finish_reason="stop")


@pytest.mark.parametrize("tying", ["tied", "untied"])
@pytest.mark.parametrize("kind", KINDS)
def test_synced_engine_scores_and_decodes_like_the_learner(kind, tying, engines, model_paths):
    engine = engines(kind, tying)
    learner, tokenizer = load_policy(model_paths[tying], "float32")
    trajectories = [
        trajectory(i, encode(tokenizer, prompt), encode(tokenizer, response))
        for i, (prompt, response) in enumerate(TEXTS)
    ]
    sequences = [t.prompt_ids + t.response_ids for t in trajectories]
    starts = [len(t.prompt_ids) for t in trajectories]
    batch = pad_batch(trajectories, tokenizer.pad_token_id)
    # The long prompt fills whole KV blocks (128 tokens on CPU vLLM), which a prefix cache
    # would keep from before the sync and reuse.
    prompts = [t.prompt_ids for t in trajectories] + [encode(tokenizer, " 12 + 7 = 19." * 40)]
    greedy = SamplingSpec(temperature=0.0, max_new_tokens=8)
    engine.generate(prompts, greedy)

    for sync, temperature in [(1, 1.0), (2, 0.7)]:  # two syncs: the second replaces the first
        before = engine_logprobs(engine, sequences, starts, temperature)
        perturb_(learner, seed=sync)
        engine.load_weights(learner.state_dict())
        after = engine_logprobs(engine, sequences, starts, temperature)

        with torch.no_grad():
            learner_logprobs = response_logprobs(PolicyTrunk(learner), batch, temperature)
        expected = learner_logprobs[batch.response_mask.bool()]
        assert (after - expected).abs().max() < 1e-3
        assert (after - before).abs().max() > 0.05  # a no-op sync fails here

    for prompt, samples in zip(prompts, engine.generate(prompts, greedy), strict=True):
        expected_ids = greedy_continuation(learner, tokenizer.eos_token_id, prompt, 8)
        assert samples[0].token_ids == expected_ids


@pytest.mark.parametrize("kind", KINDS)
def test_n_samples_per_prompt_end_at_eos_or_max_new_tokens(kind, engines, tokenizer):
    prompts = [encode(tokenizer, "Compute 12 + 7."), encode(tokenizer, "Hi")]
    spec = SamplingSpec(temperature=1.0, max_new_tokens=6, seed=3)
    result = engines(kind).generate(prompts, spec, n=3)

    assert [len(samples) for samples in result] == [3, 3]
    for samples in result:
        assert len({tuple(g.token_ids) for g in samples}) > 1  # independent samples
        for g in samples:
            if g.finish_reason == "length":
                assert len(g.token_ids) == 6
            else:
                assert g.finish_reason == "stop"
                assert g.token_ids[-1] == tokenizer.eos_token_id and len(g.token_ids) <= 6
    assert any(g.finish_reason == "length" for samples in result for g in samples)

    greedy = engines(kind).generate(prompts[:1], SamplingSpec(temperature=0.0), n=2)[0]
    assert greedy[0] == greedy[1]


@pytest.mark.parametrize("kind", KINDS)
def test_a_temperature_below_the_greedy_threshold_decodes_greedily(kind, engines, tokenizer):
    """A tiny positive temperature (schemathesis sent 4.8e-258) would divide logits into inf."""
    prompt = [encode(tokenizer, "Compute 12 + 7.")]
    tiny = SamplingSpec(temperature=GREEDY_BELOW_TEMPERATURE / 1e250, max_new_tokens=8)
    greedy = SamplingSpec(temperature=0.0, max_new_tokens=8)
    samples = engines(kind).generate(prompt, tiny, n=2)[0]
    assert samples[0].token_ids == samples[1].token_ids
    assert samples[0].token_ids == engines(kind).generate(prompt, greedy)[0][0].token_ids


def stop_string_across_two_tokens(tokenizer, token_ids):
    """A stop string that first appears in `token_ids`' text when token k + 1 is written,
    starting inside token k: (the string, k + 2 = how many tokens generation keeps)."""
    for k in range(1, len(token_ids) - 1):
        before = tokenizer.decode(token_ids[:k], skip_special_tokens=True)
        through_k = tokenizer.decode(token_ids[: k + 1], skip_special_tokens=True)
        through_next = tokenizer.decode(token_ids[: k + 2], skip_special_tokens=True)
        if not (len(before) < len(through_k) < len(through_next)):
            continue  # a token with no whole character of its own
        stop = through_next[len(through_k) - 1 :]
        if stop not in through_k:
            return stop, k + 2
    raise AssertionError(f"no usable stop string in {tokenizer.decode(token_ids)!r}")


@pytest.mark.parametrize("kind", KINDS)
def test_generation_stops_right_after_a_stop_string(kind, engines, tokenizer):
    engine = engines(kind)
    prompt = encode(tokenizer, "Compute 12 + 7.")
    unstopped = engine.generate([prompt], SamplingSpec(temperature=0.0, max_new_tokens=24))
    free = unstopped[0][0].token_ids
    stop, kept = stop_string_across_two_tokens(tokenizer, free)

    spec = SamplingSpec(temperature=0.0, max_new_tokens=24, stop=("never written", stop))
    stopped = engine.generate([prompt], spec)[0][0]

    assert stopped == Generation(free[:kept], "stop")


@pytest.mark.parametrize("kind", KINDS)
def test_a_seed_reproduces_samples_and_unseeded_calls_differ(kind, engines, tokenizer):
    engine = engines(kind)
    prompts = [encode(tokenizer, "Compute 12 + 7."), encode(tokenizer, "Hi")]

    def sample(seed):
        return engine.generate(prompts, SamplingSpec(max_new_tokens=8, seed=seed), n=2)

    assert sample(11) == sample(11)
    assert sample(11) != sample(12)
    assert sample(None) != sample(None)


@pytest.mark.parametrize("kind", KINDS)
def test_samples_follow_the_policy_at_the_sampling_temperature(kind, engines, raw_tiny_model):
    """First tokens land in probability bins as often as the policy says: no top-k, no
    repetition penalty, nothing but softmax(logits / T), which is what the learner assumes."""
    engine = engines(kind)
    policy, tokenizer = load_policy(raw_tiny_model, "float32")
    with torch.no_grad():
        # Sharpen the nearly uniform raw model, so temperature and truncation both matter.
        policy.model.norm.weight.mul_(5.0)
    engine.load_weights(policy.state_dict())
    prompt = encode(tokenizer, "Compute 12 + 7.")
    temperature, num_samples = 0.7, 400
    with torch.no_grad():
        logits = policy(torch.tensor([prompt])).logits[0, -1]
    probs = torch.softmax(logits / temperature, dim=-1)
    # Bins of about a quarter of the mass each, from the likeliest tokens down.
    order = probs.argsort(descending=True)
    mass_before = probs[order].cumsum(0) - probs[order]
    bin_of_token = torch.empty_like(order)
    bin_of_token[order] = (mass_before / 0.25).floor().long().clamp(max=3)
    expected = torch.zeros(4).index_add_(0, bin_of_token, probs)

    spec = SamplingSpec(temperature=temperature, max_new_tokens=1, seed=5)
    samples = engine.generate([prompt], spec, n=num_samples)[0]
    first_tokens = torch.tensor([g.token_ids[0] for g in samples])
    observed = torch.bincount(bin_of_token[first_tokens], minlength=4) / num_samples

    tolerance = 4 * (expected * (1 - expected) / num_samples).sqrt()
    assert ((observed - expected).abs() < tolerance).all(), (observed, expected)


@pytest.mark.slow
def test_closing_one_vllm_engine_leaves_the_others_of_the_process_working(
    engines, model_paths, tokenizer
):
    survivor = engines("vllm")  # a rollout worker holds one engine per agent in one process
    make_engine("vllm", model_paths["tied"], seed=1).close()
    result = survivor.generate([encode(tokenizer, "Hi")], SamplingSpec(max_new_tokens=4, seed=1))
    assert len(result[0][0].token_ids) > 0


@pytest.mark.parametrize("kind", KINDS)
def test_an_engine_without_a_sleep_mode_reports_sleep_and_wake_up_as_noops(kind, engines):
    # vLLM sleeps only on CUDA and when built with enable_sleep_mode (trainer.offload)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    expected = "noop:hf" if kind == "hf" else f"noop:{device}"
    engine = engines(kind)
    assert (engine.sleep(), engine.wake_up()) == (expected, expected)


def test_engine_kinds_and_requests_are_checked():
    with pytest.raises(ValueError, match="unknown rollout engine"):
        make_engine("tgi", "builtin:tiny")
    with pytest.raises(ValueError, match="at least 1"):
        check_generate_request([[1, 2]], n=0)
    with pytest.raises(ValueError, match="at least one token"):
        check_generate_request([[1, 2], []], n=1)
    with pytest.raises(ValueError, match="start 0"):
        check_logprob_request([[1, 2, 3]], [0], 1.0)
    with pytest.raises(ValueError, match="temperature"):
        check_logprob_request([[1, 2, 3]], [1], 0.0)


@pytest.mark.parametrize("tying", ["tied", "untied"])
@pytest.mark.parametrize("kind", KINDS)
def test_weights_streamed_in_buckets_give_the_engine_of_one_whole_push(
    kind, tying, engines, model_paths
):
    """`Learner.weight_buckets` (what `push_weights` streams) loaded bucket by bucket: the
    engine scores bit-identically to the same weights pushed whole, and like the learner."""
    from satseq.actors.learner import Learner, LearnerSpec

    engine = engines(kind, tying)
    learner = Learner(LearnerSpec(model_path=model_paths[tying], agent_index=0))
    tokenizer = learner.policy.tokenizer
    trajectories = [
        trajectory(i, encode(tokenizer, prompt), encode(tokenizer, response))
        for i, (prompt, response) in enumerate(TEXTS)
    ]
    sequences = [t.prompt_ids + t.response_ids for t in trajectories]
    starts = [len(t.prompt_ids) for t in trajectories]
    perturb_(learner.policy.model, seed=7)
    engine.load_weights(learner.weights())
    whole = engine_logprobs(engine, sequences, starts, 1.0)

    layer_mb = (
        sum(t.nbytes for name, t in learner.weights().items() if name.startswith("model.layers.0."))
        / 2**20
    )
    buckets = list(learner.weight_buckets(layer_mb))
    assert len(buckets) > 2
    perturb_(learner.policy.model, seed=8)
    engine.load_weights(learner.weights())  # other weights in between
    assert not torch.equal(engine_logprobs(engine, sequences, starts, 1.0), whole)
    for bucket in buckets:
        engine.load_weights(bucket)
    assert torch.equal(engine_logprobs(engine, sequences, starts, 1.0), whole)

    perturb_(learner.policy.model, seed=8, scale=-0.05)  # back to seed 7's weights, up to rounding
    batch = pad_batch(trajectories, tokenizer.pad_token_id)
    with torch.no_grad():
        expected = response_logprobs(PolicyTrunk(learner.policy.model), batch, 1.0)
    assert (whole - expected[batch.response_mask.bool()]).abs().max() < 1e-3
