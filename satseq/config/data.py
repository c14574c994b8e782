"""What the team is asked and how it is scored: `data:` (prompts, the synthetic task, data
files) and `reward:`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from satseq.config.section import Section
from satseq.data.synthetic import resolve_difficulty


class PromptConfig(Section):
    """How a problem becomes the chat the model is given."""

    system_prompt: str | None = Field(None, description="a system message first; None: none")
    instruction: str | None = Field(
        None,
        description="instruction after the problem; None: the SPO recipe's \\boxed{} wording",
    )
    tool_prompt: bool = Field(
        False, description="tell the model it may run Python in <code> tags (`--tools` sets it)"
    )
    chat_template: str | None = Field(
        None,
        description="the chat template in place of the tokenizer's: 'plain' (a base model with "
        "none: Question:/Answer: lines), a path to a .jinja file, or the Jinja text itself; "
        "None: the tokenizer's",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="variables the chat template reads, e.g. {enable_thinking: false} (Qwen3)",
    )

    @field_validator("chat_template")
    @classmethod
    def _a_template_file_exists(cls, template: str | None) -> str | None:
        if template is not None and template.endswith(".jinja") and not Path(template).is_file():
            raise ValueError(f"{template}: no such .jinja file")
        return template


class SyntheticDataConfig(Section):
    """The built-in synthetic arithmetic task (`data.train: synthetic`)."""

    split: Literal["train", "test"] = Field(
        "train",
        description="split to train on: 'train'; 'test' is held out for `satseq eval` and "
        "validation, and the builtin models were warm-started on a third split, 'warmup' (the "
        "level-1 models builtin:tiny and builtin:tiny-tool on 'train' and 'warmup' both, so runs "
        "of those train on 'test')",
    )
    n_train: int = Field(
        256, ge=1, description="problems of the split (level 1 has ~350 train); stages cycle them"
    )
    difficulty: int | str = Field(
        1,
        description="a level 1-5 or a task name: 'two_digit_sums' (the quickstart's) or "
        "'levels_1_to_3' (levels 1-3 mixed, over 1,000 distinct test problems)",
    )
    style: Literal["symbols", "words", "mixed"] = Field(
        "symbols",
        description='symbols ("7 + 9"), words ("What is seven plus 12?"), or mixed (each problem '
        "picks one)",
    )
    seed: int = Field(0, description="the problems' seed; it also picks the held-out ones scored")

    @field_validator("difficulty")
    @classmethod
    def _known_difficulty(cls, difficulty: int | str) -> int | str:
        resolve_difficulty(difficulty)  # a DataError (a ValueError) names the known ones
        return difficulty


class DataConfig(Section):
    """The training problems, the validation sets and the prompt."""

    train: str | list[str] = Field(
        "synthetic",
        description="'synthetic', or the training data: a JSONL or parquet file, a dataset "
        "directory (`save_to_disk` output or a Hub-style one), a Hugging Face dataset name, or a "
        "list of these (read in order); verl's `data.train_files` is accepted as this key",
    )
    val_files: list[str] = Field(
        default_factory=list,
        description="validation sets: JSONL/parquet paths or names `satseq eval --dataset` takes",
    )
    split: str = Field(
        "train", description="the split read from a dataset directory or Hugging Face dataset name"
    )
    field_map: dict[str, str] | None = Field(
        None, description="e.g. {problem: question, answer: a.b}"
    )
    skip_bad_rows: bool = Field(
        False, description="count and skip malformed rows; false: fail naming the file and line"
    )
    synthetic: SyntheticDataConfig = Field(
        default_factory=SyntheticDataConfig,
        description="the synthetic task, for data.train: synthetic",
    )
    prompt: PromptConfig = Field(default_factory=PromptConfig, description="the prompt format")

    @field_validator("train")
    @classmethod
    def _a_list_names_data_sources(cls, train: str | list[str]) -> str | list[str]:
        if isinstance(train, str):
            return train
        if not train:
            raise ValueError("an empty list: give at least one file, directory or dataset name")
        if "synthetic" in train:
            raise ValueError("'synthetic' is the built-in task on its own, not a listed source")
        return train


class WeightedReward(Section):
    """One reward function of a weighted sum r = Σ_k w_k r_k."""

    function: str = Field(
        description="'package.module:function', or 'verify' for the built-in math-verify check"
    )
    weight: float = Field(1.0, allow_inf_nan=False, description="its weight w_k")


class RewardConfig(Section):
    """How a response is scored: its answer (the last `\\boxed{}`, else the fallbacks) verified
    against the reference with math-verify, a custom function, or a weighted sum of several."""

    function: str | None = Field(None, description="'package.module:function' custom reward")
    functions: list[WeightedReward] = Field(
        default_factory=list,
        description="several reward functions, the reward their weighted sum (TRL's "
        "reward_funcs and reward_weights); replaces `function`",
    )
    fallbacks: list[Literal["answer_colon", "answer_is", "last_number"]] = Field(
        default_factory=list,
        description='extractors tried in order when there is no \\boxed{}: "Answer: 42", "the '
        'answer is 42", the last number',
    )
    allow_percent: bool = Field(False, description='"10%" equals both 10 and 0.1')
    format_rule: bool = Field(
        False, description="SPO format rule: exactly one </think>, no tools after"
    )
    timeout_s: float = Field(
        2.0, gt=0.0, description="deadline for verifying one sample or one custom-function call, s"
    )

    @model_validator(mode="after")
    def _one_way_to_name_the_functions(self) -> RewardConfig:
        if self.function is not None and self.functions:
            raise ValueError(
                "reward.function and reward.functions are both given: list the function in "
                "reward.functions (with {function: verify} for the built-in check)"
            )
        return self
