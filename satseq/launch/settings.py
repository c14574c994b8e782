"""Config sections → the objects they build, for every command (STYLE: a YAML key names what it
sets). The trainer's own (each agent's learner spec, training data) are in
`cluster/learner_specs.py` and `cluster/training_data.py`.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from satseq.actors.trajectory import SamplingSpec
from satseq.config import RunConfig
from satseq.config.rollout import SandboxConfig
from satseq.data import DEFAULT_PROMPT_FORMAT, TOOL_PROMPT_FORMAT, PromptFormat
from satseq.data.prompts import PLAIN_TEMPLATE
from satseq.rewards import RewardScorer
from satseq.sandbox.backend import SandboxBackend
from satseq.sandbox.fusion_client import FusionBackend
from satseq.sandbox.local import LocalBackend, LocalSandboxSettings
from satseq.sandbox.types import IsolationLevel


def prompt_format(config: RunConfig) -> PromptFormat:
    base = TOOL_PROMPT_FORMAT if config.data.prompt.tool_prompt else DEFAULT_PROMPT_FORMAT
    prompt = config.data.prompt
    return PromptFormat(
        answer_instruction=prompt.instruction
        if prompt.instruction is not None
        else base.answer_instruction,
        system_prompt=prompt.system_prompt,
        tool_instruction=base.tool_instruction,
        chat_template=chat_template_text(prompt.chat_template),
        chat_template_kwargs=prompt.chat_template_kwargs,
    )


def chat_template_text(template: str | None) -> str | None:
    """`data.prompt.chat_template` as Jinja text: 'plain', a .jinja file's text, or as it is."""
    if template == "plain":
        return PLAIN_TEMPLATE
    if template is not None and template.endswith(".jinja"):
        return Path(template).read_text()
    return template


def reward_scorer(config: RunConfig) -> RewardScorer:
    reward = config.reward
    return RewardScorer(
        function=reward.function,
        functions=[(term.function, term.weight) for term in reward.functions],
        fallbacks=tuple(reward.fallbacks),
        allow_percent=reward.allow_percent,
        format_rule=reward.format_rule,
        timeout_s=reward.timeout_s,
    )


def sampling_spec(config: RunConfig, seed: int) -> SamplingSpec:
    """How training samples (`rollout:`)."""
    rollout = config.rollout
    return SamplingSpec(
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        max_new_tokens=rollout.max_new_tokens,
        seed=seed,
        logprobs=False,  # training never reads Generation.logprob
    )


def eval_sampling_spec(config: RunConfig) -> SamplingSpec:
    """How `satseq eval` and validation sample (`eval:`; the seeds' T 0.6, top_p 0.95)."""
    e = config.eval
    return SamplingSpec(
        temperature=e.temperature,
        top_p=e.top_p,
        top_k=e.top_k,
        max_new_tokens=e.max_new_tokens or config.rollout.max_new_tokens,
        seed=e.seed,
    )


def engine_options(config: RunConfig) -> dict:
    """The rollout engines' options, as the run's plan has them (`TeamPlan.engine_options`): a
    copy, for the caller to add to."""
    return dict(config.plan.engine_options)


def local_sandbox_settings(config: SandboxConfig) -> LocalSandboxSettings:
    """The local backend's settings from the `sandbox:` config section.

    Each config key sets the setting of the same name (STYLE: a YAML key names what it sets);
    keys the local backend does not have (`backend`, `url`) are skipped, and a setting the
    section does not have, or leaves as null, keeps its default.
    """
    names = {setting.name for setting in fields(LocalSandboxSettings)}
    values = {k: v for k, v in config.model_dump().items() if k in names and v is not None}
    values["min_isolation"] = IsolationLevel(config.min_isolation)
    return LocalSandboxSettings(**values)


def sandbox_backend(config: SandboxConfig) -> SandboxBackend:
    """The backend `config.backend` names. Call it inside the event loop that will use it.

    Raises:
        SandboxUnavailable: the local backend is below `config.min_isolation`.
    """
    if config.backend == "sandbox_fusion":
        return FusionBackend(
            config.url,
            timeout_s=config.timeout_s,
            memory_mb=config.memory_mb,
            max_output_bytes=config.max_output_bytes,
            max_concurrency=config.workers,
        )
    return LocalBackend(local_sandbox_settings(config))
