"""`Generation.logprob`, which breaks vote ties, is the sum of the sampled tokens' log-probs
under the model at temperature 1, the same in both engines."""

import pytest

from satseq.actors.engines import make_engine
from satseq.actors.trajectory import SamplingSpec
from satseq.data import DEFAULT_PROMPT_FORMAT, prompt_ids
from satseq.models import load_policy, resolve_model_path


@pytest.mark.parametrize("kind", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def test_logprob_is_the_teacher_forced_sum_at_temperature_one(kind):
    if kind == "vllm":
        pytest.importorskip("vllm")
    path = resolve_model_path("builtin:tiny")
    tokenizer = load_policy(path, "float32")[1]
    prompts = [prompt_ids(tokenizer, f"Compute {a} + 4.", DEFAULT_PROMPT_FORMAT) for a in (3, 12)]
    engine = make_engine(kind, path, seed=0)
    try:
        # T and top_p change what is drawn, not what `logprob` measures
        spec = SamplingSpec(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=1)
        samples = engine.generate(prompts, spec, n=2)
        flat = [(p, g) for p, gs in zip(prompts, samples, strict=True) for g in gs]
        reference = engine.prompt_logprobs(
            [p + g.token_ids for p, g in flat], [len(p) for p, _ in flat], temperature=1.0
        )
    finally:
        engine.close()
    for (_, generation), token_logprobs in zip(flat, reference, strict=True):
        assert generation.logprob == pytest.approx(sum(token_logprobs), abs=1e-3)
        assert generation.logprob < 0
