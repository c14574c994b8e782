"""Behaviour log-probs (overlapped stages, design §12): the log-prob an engine reports for each
token it sampled is the log-prob of that token under the distribution it sampled from, at the
sampling temperature: what the learner computes teacher-forced on the same weights."""

import pytest
import torch

from satseq.actors.engines import make_engine
from satseq.actors.forward import PolicyTrunk, response_logprobs
from satseq.actors.trajectory import SamplingSpec, Trajectory, pad_batch
from satseq.models import load_policy

TEMPERATURE = 0.7
PROMPTS = ["Compute 12 + 7.", "Solve 3 * 4", "What is 25 + 17?"]


@pytest.mark.parametrize(
    ("kind", "options", "tolerance"),
    [
        ("hf", {}, 1e-4),
        pytest.param("vllm", {"logprobs_mode": "processed_logprobs"}, 2e-3, marks=pytest.mark.slow),
    ],
)
def test_an_engines_behaviour_logprobs_are_the_learners_at_the_sampling_temperature(
    raw_tiny_model, kind, options, tolerance
):
    if kind == "vllm":
        pytest.importorskip("vllm")
    model, tokenizer = load_policy(raw_tiny_model, "float32")
    engine = make_engine(kind, raw_tiny_model, seed=0, **options)
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    spec = SamplingSpec(temperature=TEMPERATURE, max_new_tokens=12, seed=3, behaviour_logprobs=True)
    samples = [sample for (sample,) in engine.generate(prompts, spec)]
    engine.close()
    trajectories = [
        Trajectory(i, prompt, s.token_ids, [1] * len(s.token_ids), [0] * len(s.token_ids), "stop")
        for i, (prompt, s) in enumerate(zip(prompts, samples, strict=True))
    ]
    batch = pad_batch(trajectories, tokenizer.pad_token_id)
    with torch.no_grad():
        learner = response_logprobs(PolicyTrunk(model), batch, TEMPERATURE)
    for row, sample in enumerate(samples):
        n = len(sample.token_ids)
        assert n > 0 and len(sample.token_logprobs) == n
        reported = torch.tensor(sample.token_logprobs)
        assert (reported - learner[row, :n]).abs().max() < tolerance
        # at temperature 1 they would be another distribution's: a check that can fail
        with torch.no_grad():
            at_one = response_logprobs(PolicyTrunk(model), batch, 1.0)
        assert (reported - at_one[row, :n]).abs().max() > 10 * tolerance
