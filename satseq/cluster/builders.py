"""Config sections → the objects they build (STYLE: a YAML key names what it sets)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from satseq.actors.learner import LearnerSpec, LossSpec, OptimizerSpec, TrustRegionSpec
from satseq.actors.trajectory import SamplingSpec
from satseq.config import RunConfig
from satseq.data import (
    DEFAULT_PROMPT_FORMAT,
    TOOL_PROMPT_FORMAT,
    MathProblem,
    PromptFormat,
    load_problems,
    make_split,
)
from satseq.rewards import RewardScorer

log = logging.getLogger(__name__)


def training_problems(config: RunConfig) -> list[MathProblem]:
    data = config.data
    if data.train == "synthetic":
        s = data.synthetic
        return make_split(s.split, s.n_train, seed=s.seed, difficulty=s.difficulty, style=s.style)
    loaded = load_problems(
        data.train, split=data.split, field_map=data.field_map, skip_bad_rows=data.skip_bad_rows
    )
    return loaded.problems


def prompt_format(config: RunConfig) -> PromptFormat:
    base = TOOL_PROMPT_FORMAT if config.data.prompt.tool_prompt else DEFAULT_PROMPT_FORMAT
    prompt = config.data.prompt
    return PromptFormat(
        answer_instruction=prompt.instruction
        if prompt.instruction is not None
        else base.answer_instruction,
        system_prompt=prompt.system_prompt,
        tool_instruction=base.tool_instruction,
    )


def reward_scorer(config: RunConfig) -> RewardScorer:
    reward = config.reward
    return RewardScorer(
        function=reward.function,
        fallbacks=tuple(reward.fallbacks),
        allow_percent=reward.allow_percent,
        format_rule=reward.format_rule,
        timeout_s=reward.timeout_s,
    )


def sampling_spec(config: RunConfig, seed: int) -> SamplingSpec:
    rollout = config.rollout
    return SamplingSpec(
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        max_new_tokens=rollout.max_new_tokens,
        seed=seed,
        logprobs=False,  # training never reads Generation.logprob
    )


def engine_options(config: RunConfig) -> dict:
    """The rollout engines' options: torch threads per CPU core of the actor, and for vLLM on
    a GPU the share of its memory to take (`rollout.gpu_memory_utilization`)."""
    rollout = config.rollout
    options: dict = {"num_threads": max(1, int(rollout.resources.num_cpus))}
    if rollout.engine == "vllm" and rollout.resources.num_gpus > 0:
        options["gpu_memory_utilization"] = rollout.gpu_memory_utilization
    return options


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


def loss_spec(config: RunConfig) -> LossSpec:
    """The policy loss of `algorithm.name`, from that algorithm's own section (DESIGN §4)."""
    name = config.algorithm.name
    if name == "spo":  # token-level PPO-clip, clip-higher, dual-clip, token-mean
        spo = config.spo
        return LossSpec(
            ratio="token",
            eps_low=spo.eps_low,
            eps_high=spo.eps_high,
            dual_clip=spo.dual_clip,
            aggregation="token_mean",
            kl_estimator="k3",
        )
    if name == "grpo":
        grpo = config.grpo
        return LossSpec(
            ratio="token",
            eps_low=grpo.eps_low,
            eps_high=grpo.eps_high,
            aggregation="token_mean",
            kl_estimator="k3",
        )
    s = config.sat_seq
    return LossSpec(
        ratio=s.ratio,
        eps_low=s.epsilon,
        eps_high=s.epsilon,
        aggregation="seq_mean",
        kl_estimator=config.algorithm.kl_ctrl.estimator,
    )


def trust_region_spec(config: RunConfig) -> TrustRegionSpec:
    """SAT-Seq's quantile-KL trust region (`algorithm.kl_ctrl`, backtracking from `sat_seq`);
    SPO and GRPO take plain steps."""
    kl, s = config.algorithm.kl_ctrl, config.sat_seq
    return TrustRegionSpec(
        enabled=config.algorithm.name == "sat_seq",
        kl_coef=kl.kl_coef,
        target_kl=kl.target_kl,
        alpha=1.0 - kl.quantile,
        beta_growth=kl.beta_growth,
        step_shrink=kl.step_shrink,
        max_backtracks=s.max_backtracks,
        on_exhausted=s.on_exhausted,
    )


def optimizer_spec(config: RunConfig) -> OptimizerSpec:
    trainer = config.trainer
    return OptimizerSpec(
        lr=trainer.lr, weight_decay=trainer.weight_decay, grad_clip=trainer.grad_clip
    )


def gae_mode(config: RunConfig) -> bool:
    """SAT-Seq with `sat_seq.advantage: gae`: each learner holds a value head."""
    return config.algorithm.name == "sat_seq" and config.sat_seq.advantage == "gae"


def learner_spec(config: RunConfig, agent_index: int, device: str, num_threads: int) -> LearnerSpec:
    trainer = config.trainer
    dtype = (
        trainer.dtype
        if trainer.dtype != "auto"
        else ("bfloat16" if device == "cuda" else "float32")
    )
    return LearnerSpec(
        model_path=config.team.agents[agent_index].path,
        agent_index=agent_index,
        loss=loss_spec(config),
        trust_region=trust_region_spec(config),
        optimizer=optimizer_spec(config),
        dtype=dtype,
        save_dtype=trainer.save_dtype,
        device=device,
        micro_batch_size=trainer.micro_batch_size,
        max_tokens_per_micro_batch=trainer.max_tokens_per_micro_batch,
        logit_chunk_tokens=trainer.logit_chunk_tokens,
        update_steps=trainer.update_steps,
        gradient_checkpointing=trainer.gradient_checkpointing,
        temperature=config.rollout.temperature,
        value_lr=config.sat_seq.value_lr if gae_mode(config) else None,
        value_steps=config.sat_seq.value_steps,
        seed=trainer.seed + agent_index,
        num_threads=num_threads,
    )


def rollout_actor_options(config: RunConfig) -> dict:
    """Ray options of a rollout actor outside the training placement group: rollout.resources,
    on the CPU where the cluster has no GPU."""
    import ray

    resources = config.rollout.resources
    num_gpus = resources.num_gpus
    if num_gpus > 0 and ray.cluster_resources().get("GPU", 0) == 0:
        log.warning("rollout.resources asks for %s GPU but the cluster has none: CPU", num_gpus)
        num_gpus = 0.0
    return {"num_cpus": resources.num_cpus, "num_gpus": num_gpus}


def start_rollout_actors(
    config: RunConfig,
    agent_paths: dict[str, str],
    seed: int,
    options: Callable[[int], dict],
    sandbox=None,
) -> list:
    """`rollout.num_actors` rollout actors, each with an engine per agent, started and ready.

    Actor j gets the Ray options `options(j)` and the seed `seed + 1000 j` (actors never share
    a random stream); with a sandbox pool it runs the tool loop of `rollout.tools`.
    """
    import ray

    from satseq.actors.rollout import RolloutActor

    actors = [
        RolloutActor.options(**options(j)).remote(
            agent_paths,
            config.rollout.engine,
            engine_options(config),
            seed + 1000 * j,
            tools=config.rollout.tools if sandbox is not None else None,
            sandbox=sandbox,
        )
        for j in range(config.rollout.num_actors)
    ]
    ray.get([actor.ready.remote() for actor in actors])
    return actors


def start_sandbox_pool(config: RunConfig, name: str | None = None):
    """The SandboxPool actor for tool calls, started: a sandbox below `sandbox.min_isolation`
    fails here, at start-up, not on the first tool call."""
    import ray

    from satseq.sandbox.backend import make_backend
    from satseq.sandbox.pool import SandboxPoolActor

    sandbox = config.sandbox
    options = {"num_cpus": 0} | ({"name": name} if name else {})
    pool = SandboxPoolActor.options(**options).remote(
        partial(make_backend, sandbox), workers=sandbox.workers, queue_size=sandbox.queue_size
    )
    ray.get(pool.start.remote())
    return pool
