"""The team: its agents, their models, and the swaps planned for it (`team:`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from satseq.config.section import Offload, Section


class LoraConfig(Section):
    """A LoRA adapter trained on a frozen base (design §12): the agent's `path` is the base, and
    agents on one base share its rollout engine (`trainer.lora` is the team's default)."""

    rank: int = Field(16, gt=0, description="r, the adapter's rank")
    alpha: float | None = Field(
        None, gt=0.0, description="the update is scaled by alpha / rank; None: 2·rank"
    )
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="dropout on the adapter's input while training; above 0 the learner's "
        "log-probs are no longer the engines' (keep 0 for SAT-Seq's exact IS weights)",
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="the linear layers adapted, by name (q_proj, ...); all-linear: every one "
        "but the output layer",
    )

    @property
    def scale_alpha(self) -> float:
        return self.alpha if self.alpha is not None else 2.0 * self.rank


class AgentConfig(Section):
    """One agent: a model with its own weights and optimizer, or a LoRA adapter on a base."""

    name: str = Field(min_length=1, description="unique agent name; outputs go to agent_<name>/")
    path: str = Field(
        min_length=1, description="HF model dir or hub name; 'builtin:tiny' = the embedded model"
    )
    revision: str | None = Field(
        None, description="a Hub model's branch, tag or commit; None: its default branch"
    )
    trust_remote_code: bool = Field(
        False,
        description="let the model run the Python code it ships (an architecture transformers "
        "does not have: `auto_map` in its config.json), in every process that loads it",
    )
    role_prompt: str | None = Field(
        None, description="chain topology: this agent's role instruction"
    )
    offload: Offload | None = Field(None, description="this agent's trainer.offload; None: that")
    workers: int | None = Field(
        None, ge=1, description="this agent's trainer.workers_per_agent; None: that"
    )
    lora: LoraConfig | Literal[False] | None = Field(
        None,
        description="a LoRA adapter on `path` (the base); None: trainer.lora; false: a full "
        "model whatever trainer.lora says",
    )

    @field_validator("lora", mode="wrap")
    @classmethod
    def _lora_or_false(cls, value: Any, handler: Any) -> LoraConfig | Literal[False] | None:
        """An adapter's errors under its own keys (`lora.rank`), not under each member of the
        union as pydantic would name them."""
        if value is False or value is None:
            return value
        return LoraConfig.model_validate(value)


class SwapConfig(Section):
    """Plug-and-play: at the start of stage `at_stage`, agent `agent` is replaced by the model at
    `path` (same tokenizer), first projected towards the outgoing policy (mean per-state KL ≤
    delta0), then trained on by a fresh learner; a projection that misses delta0 is retried at
    the next stage (`on_budget_missed`)."""

    agent: str = Field(min_length=1, description="the team agent to replace")
    path: str = Field(min_length=1, description="the incoming model: HF dir, hub name, builtin:")
    at_stage: int = Field(ge=0, description="the swap happens before this stage")
    delta0: float = Field(
        0.05, gt=0.0, description="the projection's budget: mean per-state KL(π_new ‖ π_cur)"
    )
    max_steps: int = Field(
        300, ge=0, description="distillation steps at most before the budget counts as missed"
    )
    on_budget_missed: Literal["retry", "keep"] = Field(
        "retry",
        description="after max_steps with the mean KL still above delta0: retry (keep the "
        "outgoing agent for this stage and try the swap again at the next) or keep (go on "
        "with the incoming agent outside the budget)",
    )
    lr: float | None = Field(
        None, gt=0.0, description="the distillation's first step size; None: trainer.lr"
    )
    samples_per_prompt: int = Field(
        2, ge=1, description="the outgoing agent's samples per stage prompt (the KL's states)"
    )


class TeamConfig(Section):
    """The team: its agents in order, how they share a trajectory, and planned swaps."""

    topology: Literal["mixture", "chain"] = Field(
        "mixture",
        description="mixture: each trajectory is one agent's, agents round-robin over a prompt's G "
        "samples; chain: agents take turns on one trajectory, in team order, the last turn answers",
    )
    agents: list[AgentConfig] = Field(
        default_factory=list,
        description="the agents, at least one, in order (the static schedule's and the chain's)",
    )
    swaps: list[SwapConfig] = Field(
        default_factory=list, description="agents replaced by other models at a given stage"
    )

    @model_validator(mode="after")
    def _unique_names(self) -> TeamConfig:
        names = [a.name for a in self.agents]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"agent names must be unique, repeated: {duplicated}")
        for k, swap in enumerate(self.swaps):
            if names and swap.agent not in names:
                raise ValueError(
                    f"team.swaps[{k}].agent: {swap.agent!r} is not a team agent (agents: {names})"
                )
        slots = [(swap.agent, swap.at_stage) for swap in self.swaps]
        if len(set(slots)) < len(slots):
            raise ValueError("team.swaps: an agent is swapped twice at the same stage")
        return self
