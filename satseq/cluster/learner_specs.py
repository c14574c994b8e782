"""The config → each agent's `LearnerSpec`.

Each learner setting comes from one section: the policy loss from the recipe
(`Recipe.learner_settings`, from the algorithm's own section), the trust region from
`algorithm.kl_ctrl`, the optimiser and the rest from `trainer`. What every command builds
(sampling, engines, rewards, sandboxes) is in `satseq.launch.settings`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from satseq.actors.learner.specs import LearnerSpec, LossSpec, OptimizerSpec, TrustRegionSpec
from satseq.config import RunConfig
from satseq.config.algorithms import KLControlConfig
from satseq.config.team_plan import TeamPlan
from satseq.config.trainer import TrainerConfig
from satseq.launch.memory_plan import PROMPT_TOKENS, agent_update, checkpoint_choices
from satseq.models import is_adapter_dir
from satseq.models.adapters import adapter_base
from satseq.seeds import agent_seed


@dataclass(frozen=True)
class LearnerSettings:
    """What an algorithm asks of every learner: its loss, its trust region (or plain steps), and
    in SAT-Seq's `gae` mode the value head's learning rate."""

    loss: LossSpec
    trust_region: TrustRegionSpec
    value_lr: float | None = None


PLAIN_STEPS = TrustRegionSpec(enabled=False, kl_estimator="k3")
"""SPO and GRPO: every step is taken, no KL penalty; q is still measured (k3) and logged (GRPO
turns the measuring off unless `grpo.measure_step_kl`)."""


def trust_region_spec(kl_ctrl: KLControlConfig) -> TrustRegionSpec:
    """SAT-Seq's quantile-KL trust region with backtracking (`algorithm.kl_ctrl`)."""
    return TrustRegionSpec(
        enabled=True,
        kl_estimator=kl_ctrl.estimator,
        kl_coef=kl_ctrl.kl_coef,
        target_kl=kl_ctrl.target_kl,
        alpha=1.0 - kl_ctrl.quantile,
        beta_growth=kl_ctrl.beta_growth,
        step_shrink=kl_ctrl.step_shrink,
        max_backtracks=kl_ctrl.max_backtracks,
        on_exhausted=kl_ctrl.on_exhausted,
    )


def optimizer_spec(trainer: TrainerConfig) -> OptimizerSpec:
    return OptimizerSpec(
        lr=trainer.lr, weight_decay=trainer.weight_decay, grad_clip=trainer.grad_clip
    )


def learner_spec(
    config: RunConfig,
    agent_index: int,
    settings: LearnerSettings,
    device: str,
    num_threads: int,
    model_path: str | None = None,
) -> LearnerSpec:
    """Agent `agent_index`'s learner: its model (`team.agents[i].path`, or `model_path` after a
    swap), the recipe's loss and trust region (and value head lr in `gae` mode), and the
    `trainer` section's settings (`offload` and `workers` as the run's plan has them)."""
    trainer = config.trainer
    agent = config.team.agents[agent_index]
    max_tokens = trainer.max_tokens_per_micro_batch
    share, auto_checkpoints = trainer.resources.num_gpus, trainer.gradient_checkpointing == "auto"
    # on a GPU, `auto` settings and the snapshot's place come from the memory plan, finished on
    # the learner's device
    backtracks = (
        settings.trust_region.enabled and not config.plan.agents[agent_index].shares_devices
    )
    planned = device == "cuda" and (max_tokens == "auto" or auto_checkpoints or backtracks)
    update = agent_update(config, agent_index, PROMPT_TOKENS, model_path) if planned else None
    choices = checkpoint_choices(update, share) if update and auto_checkpoints else None
    dtype = (
        trainer.dtype
        if trainer.dtype != "auto"
        else ("bfloat16" if device == "cuda" else "float32")
    )
    return LearnerSpec(
        model_path=model_path or agent.path,
        agent_index=agent_index,
        loss=settings.loss,
        trust_region=settings.trust_region,
        optimizer=optimizer_spec(trainer),
        dtype=dtype,
        save_dtype=trainer.save_dtype,
        device=device,
        micro_batch_size=trainer.micro_batch_size,
        max_tokens_per_micro_batch=None if max_tokens == "auto" else max_tokens,
        token_budget=update.token_budget(share) if update and max_tokens == "auto" else None,
        logit_chunk_tokens=trainer.logit_chunk_tokens,
        ppo_epochs=trainer.ppo_epochs,
        mini_batch_size=trainer.mini_batch_size,
        fp32_head=trainer.fp32_head,
        checkpoint_every=trainer.checkpoint_every,
        checkpoint_choices=choices,
        snapshot_budget=update.token_budget(share) if update and backtracks else None,
        temperature=config.rollout.temperature,  # behaviour log-probs at the sampling temperature
        value_lr=settings.value_lr,
        value_steps=config.sat_seq.value_steps,
        seed=agent_seed(trainer.seed, agent_index),
        num_threads=num_threads,
        offload=config.plan.agents[agent_index].offload,
        workers=config.plan.agents[agent_index].workers,
    )


def learner_hosts(plan: TeamPlan, model_dirs: list[str]) -> list[list[int]]:
    """The team's learner processes by the agents each holds (agent i on `model_dirs[i]`): with
    `trainer.share_lora_learners` (in the run's `plan`), the LoRA agents of one base share one;
    every other agent has its own (W of them, sharded). In team order of each process's first
    agent."""
    hosts: list[list[int]] = []
    by_base: dict[Path, list[int]] = {}
    for i, directory in enumerate(model_dirs):
        if not (plan.share_lora_learners and is_adapter_dir(directory)):
            hosts.append([i])
            continue
        base = adapter_base(directory)
        if base not in by_base:
            by_base[base] = []
            hosts.append(by_base[base])
        by_base[base].append(i)
    return hosts
