"""The embedded tiny model (design §9): a small Qwen2 causal LM that the project builds itself.

`write_tiny_model` trains the tokenizer on the synthetic task's text, initialises a
`Qwen2ForCausalLM` from the seed, warm-starts it on the quickstart task's solutions, and saves
model and tokenizer with `save_pretrained` (safetensors). The directory then loads unchanged in
transformers and vLLM, like any Hugging Face checkpoint.

Sizes:
- `quickstart`: about 0.16M parameters (hidden 64, 2 layers), warm-started in under a minute on
  one CPU core. The `carry` variant (the quickstart team) learns its teacher's mistakes: it
  carries about 30% of the time and is wrong about its teacher's three facts (see
  `satseq.models.teacher`), so on held-out problems about 65% of its answers are right, and RL
  has room to raise that within minutes. The `steps` variant samples right answers to about
  40% of held-out difficulty-1 problems at temperature 1.0.
- `50m`: about 50M parameters, random weights (no warm start), for throughput benchmarks.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from satseq.data import MathProblem
from satseq.models.corpus import (
    VARIANTS,
    Variant,
    tokenizer_corpus,
    warm_start_problems,
    warm_start_prompt_formats,
)
from satseq.models.teacher import Teacher
from satseq.models.tokenizer import train_tokenizer
from satseq.models.warm_start import (
    WarmStartConfig,
    deterministic_torch,
    supervised_examples,
    warm_start,
)

logger = logging.getLogger(__name__)

# Bump when a change to this package changes what a given build config produces, so that cached
# builds (keyed by `TinyBuildConfig.fingerprint`) are rebuilt.
FORMAT_VERSION = 1
TOKENIZER_VOCAB_SIZE = 512
BUILD_MANIFEST = "satseq_build.json"


class TinyModelError(ValueError):
    """An unknown tiny-model size or variant, worded for the user."""


@dataclass(frozen=True)
class TinyArchitecture:
    """The Qwen2 shape of a tiny model. vLLM's CPU attention needs head_dim in {32, 64, ...}."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0

    def qwen2_config(self, tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
        return Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            tie_word_embeddings=True,  # as Qwen2's small models; halves a tiny model's size
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            dtype="float32",
        )


@dataclass(frozen=True)
class TinySize:
    architecture: TinyArchitecture
    # The warm start of each variant; a variant without one keeps the random initial weights.
    warm_starts: Mapping[Variant, WarmStartConfig]


TINY_SIZES = {
    "quickstart": TinySize(
        TinyArchitecture(
            hidden_size=64,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
        ),
        {
            # Tuned (with the architecture) so that on held-out quickstart problems the model
            # samples correct answers about 38% of the time at temperature 1.0; its greedy
            # answers to train problems are about 95% right, so RL has ground to gain.
            "steps": WarmStartConfig(steps=1200, learning_rate=3e-3),
            # Tool use is mostly copying (the expression into print(), the printed value into
            # the box). Measured in the agent loop on the quickstart_tools problems: 400 steps
            # copy the operator at random and RL gains nothing; 1200 solve everything (reward
            # 1.0, nothing to learn); 650 start at 0.62 and RL reaches 0.80 in 12 stages.
            "tool": WarmStartConfig(steps=650, learning_rate=3e-3),
            # Enough for every seed to learn the sums and its teacher's habits. Measured at
            # T 0.6 on held-out problems: 900 and 1200 steps give the same accuracy on sums
            # without a carry (~0.96) and carry rate (~0.3); at 500 steps (a variant writing
            # both columns) two of three seeds had not yet learned the sums themselves.
            "carry": WarmStartConfig(steps=900, learning_rate=3e-3),
        },
    ),
    "50m": TinySize(
        TinyArchitecture(
            hidden_size=640,
            intermediate_size=2048,
            num_hidden_layers=10,
            num_attention_heads=10,
            num_key_value_heads=2,
        ),
        warm_starts={},
    ),
}


@dataclass(frozen=True)
class TinyBuildConfig:
    """Everything that determines a tiny model's weights: two equal configs build equal models
    (on the same CPU and library versions)."""

    size: str
    variant: Variant
    seed: int
    architecture: TinyArchitecture
    warm_start: WarmStartConfig | None
    tokenizer_vocab_size: int = TOKENIZER_VOCAB_SIZE
    format_version: int = FORMAT_VERSION
    teacher: Teacher | None = None  # who solves the `carry` variant's problems

    def fingerprint(self) -> str:
        """A short hash of this config and of the text the build trains on.

        The text is part of it so that a change to `satseq.data`'s problems or prompts makes a
        new model instead of reusing one trained on the old text.
        """
        return _fingerprint(self)

    def problems(self) -> list[MathProblem]:
        """The problems (with solutions) the warm start trains on."""
        return warm_start_problems(self.variant, self.teacher)


@functools.cache  # hashing regenerates the whole corpus; every `builtin:` lookup asks
def _fingerprint(config: TinyBuildConfig) -> str:
    fields = asdict(config)
    if config.teacher is None:  # hashed as before the field existed: those builds stay valid
        del fields["teacher"]
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    for text in tokenizer_corpus():
        digest.update(text.encode())
    for problem in config.problems():
        digest.update((problem.problem + (problem.solution or "")).encode())
    return digest.hexdigest()[:16]


def tiny_build_config(
    size: str = "quickstart",
    variant: Variant = "steps",
    seed: int = 0,
    warm_start_steps: int | None = None,
    teacher: Teacher | None = None,
) -> TinyBuildConfig:
    """The build config of a named size; `warm_start_steps` overrides the size's step count.
    `teacher` solves the `carry` variant's problems (None: a perfect one)."""
    if size not in TINY_SIZES:
        raise TinyModelError(f"unknown tiny model size {size!r}; use one of {sorted(TINY_SIZES)}")
    if variant not in VARIANTS:
        raise TinyModelError(f"unknown tiny model variant {variant!r}; use one of {VARIANTS}")
    tiny_size = TINY_SIZES[size]
    warm_start_config = tiny_size.warm_starts.get(variant)
    if warm_start_steps is not None:
        if warm_start_config is None:
            raise TinyModelError(
                f"tiny model size {size!r} has no {variant} warm start to set the steps of"
            )
        warm_start_config = replace(warm_start_config, steps=warm_start_steps)
    if variant == "carry":
        teacher = teacher or Teacher()
    elif teacher is not None:
        raise TinyModelError(f"only the carry variant has a teacher, not {variant!r}")
    return TinyBuildConfig(
        size, variant, seed, tiny_size.architecture, warm_start_config, teacher=teacher
    )


def write_tiny_model(config: TinyBuildConfig, out_dir: str | Path) -> Path:
    """Build the model `config` describes and save it (model, tokenizer, manifest) in `out_dir`."""
    started = time.perf_counter()
    out_dir = Path(out_dir)
    tokenizer = train_tokenizer(tokenizer_corpus(), config.tokenizer_vocab_size)
    with deterministic_torch(config.seed):
        model = Qwen2ForCausalLM(config.architecture.qwen2_config(tokenizer))
        losses = []
        if config.warm_start is not None:
            examples = supervised_examples(
                tokenizer, config.problems(), warm_start_prompt_formats(config.variant)
            )
            losses = warm_start(
                model, examples, config.warm_start, tokenizer.pad_token_id, config.seed
            )
    # Plain sampling by default, in transformers and vLLM alike: without `top_k=0` here,
    # transformers' `generate` would silently keep only the 50 likeliest tokens.
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    manifest: dict[str, Any] = {
        "build_config": asdict(config),
        "fingerprint": config.fingerprint(),
        "num_parameters": model.num_parameters(),
        "final_loss": losses[-1] if losses else None,
        "build_seconds": round(time.perf_counter() - started, 2),
    }
    (out_dir / BUILD_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    logger.info(
        "built tiny model %s/%s (%d parameters, final warm-start loss %s) in %.1fs",
        config.size,
        config.variant,
        manifest["num_parameters"],
        manifest["final_loss"],
        manifest["build_seconds"],
    )
    return out_dir
