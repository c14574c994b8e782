"""The builtin tiny model: a Qwen2 checkpoint that transformers loads unchanged, warm-started so
that sampling solves some but not all held-out quickstart problems."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, Qwen2ForCausalLM

from satseq.data import DEFAULT_PROMPT_FORMAT, TOOL_PROMPT_FORMAT, build_prompt, make_split
from satseq.models import (
    TINY_SIZES,
    TinyModelError,
    build_tiny_model,
    load_policy,
    resolve_builtin,
    tiny_build_config,
)
from satseq.models.corpus import tokenizer_corpus
from satseq.models.teacher import QUICKSTART_TEACHERS
from satseq.models.tiny import BUILD_MANIFEST
from satseq.models.tokenizer import train_tokenizer
from satseq.rewards import RewardScorer

# The quickstart task (configs/quickstart.yaml): difficulty 1, symbols, held-out test split.
QUICKSTART_TEST = {"difficulty": 1, "style": "symbols"}
PASS_RATE_BAND = (0.2, 0.7)


def generate(model, tokenizer, prompts, *, sample, max_new_tokens=48):
    """Responses to `prompts` (left-padded batch); sampling is plain temperature-1.0 sampling."""
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        output = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=1.0 if sample else None,
            top_k=0 if sample else None,
            top_p=1.0 if sample else None,
        )
    new_tokens = output[:, batch["input_ids"].shape[1] :]
    return tokenizer.batch_decode(new_tokens, skip_special_tokens=True)


def test_builtin_tiny_is_a_small_qwen2_checkpoint(tiny_model_dir):
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.model_type == "qwen2"
    assert config.hidden_size // config.num_attention_heads == 32  # a vLLM CPU head size
    assert (tiny_model_dir / "model.safetensors").is_file()
    assert (tiny_model_dir / "tokenizer.json").is_file()
    manifest = json.loads((tiny_model_dir / BUILD_MANIFEST).read_text())
    assert manifest["build_config"]["size"] == "quickstart"
    assert 100_000 < manifest["num_parameters"] < 1_000_000


def test_transformers_loads_model_and_tokenizer(tiny_policy):
    model, tokenizer = tiny_policy
    assert isinstance(model, Qwen2ForCausalLM)
    assert model.dtype == torch.float32
    prompt = build_prompt(tokenizer, make_split("test", 1, **QUICKSTART_TEST)[0])
    assert prompt.endswith("<|im_start|>assistant\n")


def test_greedy_answers_are_well_formed(tiny_policy):
    model, tokenizer = tiny_policy
    problems = make_split("test", 8, **QUICKSTART_TEST)
    prompts = [build_prompt(tokenizer, problem) for problem in problems]
    for response in generate(model, tokenizer, prompts, sample=False):
        assert response.count("\\boxed{") == 1, response
        assert response.endswith("}"), response  # stopped at <|im_end|>


@pytest.mark.slow
def test_sampled_pass_rate_on_held_out_problems_is_in_the_band(tiny_policy):
    model, tokenizer = tiny_policy
    problems = make_split("test", 128, **QUICKSTART_TEST)
    samples_per_problem = 2
    prompts = [build_prompt(tokenizer, p, DEFAULT_PROMPT_FORMAT) for p in problems]
    torch.manual_seed(0)
    responses = [
        response
        for _ in range(samples_per_problem)
        for response in generate(model, tokenizer, prompts, sample=True)
    ]
    answers = [problem.answer for problem in problems] * samples_per_problem
    with RewardScorer(fallbacks=()) as scorer:
        scores = scorer.score_batch(prompts * samples_per_problem, responses, answers).scores
    pass_rate = sum(scores) / len(scores)
    print(f"tiny model pass rate at T=1.0: {pass_rate:.3f} over {len(scores)} samples")
    assert PASS_RATE_BAND[0] <= pass_rate <= PASS_RATE_BAND[1]


@pytest.mark.slow
def test_tool_variant_calls_the_sandbox_with_the_expression(tiny_tool_model_dir):
    model, tokenizer = load_policy(tiny_tool_model_dir)
    problems = make_split("test", 8, **QUICKSTART_TEST)
    prompts = [build_prompt(tokenizer, problem, TOOL_PROMPT_FORMAT) for problem in problems]
    responses = generate(model, tokenizer, prompts, sample=False, max_new_tokens=24)
    for response in responses:
        assert response.startswith("<code>print(") and "</code>" in response, response
    # Generation stops at </code> in the agent loop; what follows here is never used.
    expected_code = [f"<code>print({p.meta['expression']})</code>" for p in problems]
    exact_calls = sum(r.startswith(c) for r, c in zip(responses, expected_code, strict=True))
    assert exact_calls >= 3, responses  # it copies about 60% of expressions exactly


def test_short_build_is_deterministic(tmp_path):
    first = build_tiny_model(tmp_path / "first", warm_start_steps=3)
    second = build_tiny_model(tmp_path / "second", warm_start_steps=3)
    other_seed = build_tiny_model(tmp_path / "other-seed", seed=1, warm_start_steps=3)
    weights = [load_file(path / "model.safetensors") for path in (first, second, other_seed)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    assert not torch.equal(
        weights[0]["model.embed_tokens.weight"], weights[2]["model.embed_tokens.weight"]
    )
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()


def test_a_builtin_models_settings_are_copied_from_the_model_cache(builtin_models, tmp_path):
    """The defaults are builtin:tiny's build config: its cached directory, copied file for
    file (the manifest's build time included, which a new build would write anew)."""
    built = build_tiny_model(tmp_path / "my-model")
    cached = resolve_builtin("builtin:tiny")
    names = sorted(path.name for path in cached.iterdir())
    assert names == sorted(path.name for path in built.iterdir()) and BUILD_MANIFEST in names
    assert all((built / name).read_bytes() == (cached / name).read_bytes() for name in names)


def test_carry_variant_learns_from_a_teacher(tmp_path):
    teacher = QUICKSTART_TEACHERS[1]
    built = build_tiny_model(tmp_path / "carry", variant="carry", seed=1, warm_start_steps=3)
    manifest = json.loads((built / BUILD_MANIFEST).read_text())
    # no teacher given: a perfect one
    assert manifest["build_config"]["teacher"] == {"carry_slip": 0.0, "wrong_facts": [], "seed": 0}
    config = tiny_build_config("quickstart", "carry", seed=1, teacher=teacher)
    assert config.problems()[0].solution == teacher.solve(config.problems()[0]).solution
    with pytest.raises(TinyModelError, match="only the carry variant has a teacher"):
        tiny_build_config("quickstart", "steps", teacher=teacher)


def test_50m_size_is_a_random_init_of_about_50m_parameters():
    size = TINY_SIZES["50m"]
    assert not size.warm_starts
    config = size.architecture.qwen2_config(train_tokenizer(tokenizer_corpus(), vocab_size=512))
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert 45e6 < model.num_parameters() < 55e6


def test_unknown_size_or_variant_is_named():
    with pytest.raises(TinyModelError, match="unknown tiny model size 'huge'"):
        build_tiny_model("unused", size="huge")
    with pytest.raises(TinyModelError, match="unknown tiny model variant 'words'"):
        build_tiny_model("unused", variant="words")
