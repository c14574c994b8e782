"""What a learner is built from: its loss, trust region, optimiser and the rest of its settings
(`satseq.cluster.learner_specs` makes them from the config; each recipe picks its loss)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from satseq.algo.lm_head import DEFAULT_CHUNK_TOKENS
from satseq.algo.losses import Aggregation, RatioMode


@dataclass(frozen=True)
class LossSpec:
    """Which policy loss the learner minimises (SAT-Seq defaults; SPO/GRPO set their own)."""

    ratio: RatioMode = "seq"
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    aggregation: Aggregation = "seq_mean"


@dataclass(frozen=True)
class TrustRegionSpec:
    """The quantile-KL trust region and its β_i (design §4). enabled=False: plain PPO steps,
    no KL penalty, no backtracking (SPO, GRPO); q is still measured and logged unless
    measure=False, which saves the forward pass after each step (and leaves no logp_hat).
    kl_estimator: the KL of the penalty and of q, exact over the vocabulary or k3 on the sampled
    tokens."""

    def __post_init__(self) -> None:
        if self.enabled and not self.measure:
            raise ValueError("the trust region decides on q: it cannot skip measuring it")

    enabled: bool = True
    measure: bool = True  # q and the new log-probs after each step (the trust region needs both)
    kl_estimator: Literal["exact", "k3"] = "exact"
    kl_coef: float = 0.01  # the initial β_i
    target_kl: float = 0.05
    alpha: float = 0.1  # the KL quantile is the (1 − α) quantile
    beta_growth: float = 1.5
    step_shrink: float = 0.5
    max_backtracks: int = 3
    on_exhausted: Literal["reject", "keep"] = "reject"


@dataclass(frozen=True)
class OptimizerSpec:
    """AdamW over the float32 master weights, with gradient-norm clipping."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0


@dataclass(frozen=True)
class TokenBudget:
    """A micro-batch's token budget from the memory plan (`satseq.launch.memory_plan`): the
    update's bytes that do not grow with a micro-batch's tokens (`fixed`: state, weight casts,
    logits, reference; `state` among them), the optimiser step's temporaries, and the
    activations' bytes a token, against `usable` of this rank's `share` of its device; `wanted`:
    the tokens a configured micro-batch needs (micro_batch_size longest trajectories)."""

    fixed: float
    state: float
    step: float
    per_token: float
    share: float
    usable: float
    wanted: int = 0

    def tokens(self, device_bytes: float, reserved: float = 0.0) -> int:
        """The most tokens whose activations fit beside the rest of the update and `reserved`
        bytes more; 0 where the rest alone does not fit."""
        usable = self.usable * self.share * device_bytes - reserved
        if self.state + self.step > usable or usable - self.fixed < self.per_token:
            return 0
        return math.floor((usable - self.fixed) / self.per_token)


SMALL_SNAPSHOT = 1 / 64
"""A snapshot of at most this share of its device (a LoRA adapter's, or a small model's) is kept
on the device with or without a plan: it cannot crowd out a micro-batch."""


def snapshot_on_device(budget: TokenBudget | None, snapshot: float, device_bytes: float) -> bool:
    """Whether the trust region's backtracking snapshot (`snapshot` bytes) is kept on a device
    of `device_bytes` rather than in host memory: where it is small, or where the plan's
    `budget` (at the chosen stride) still holds a configured micro-batch beside it. It never
    makes a micro-batch smaller than configured, nor makes more layers checkpointed; a learner
    that lends its device between updates (`offload: idle_agents`) keeps it in host memory."""
    if snapshot <= SMALL_SNAPSHOT * device_bytes:
        return True
    return budget is not None and budget.tokens(device_bytes, snapshot) >= max(budget.wanted, 1)


def snapshot_bytes(trained_parameters: int, workers: int = 1) -> float:
    """The backtracking snapshot of one rank: its share of the float32 trained weights and of
    AdamW's two float32 moments (12 bytes a parameter)."""
    return 12 * trained_parameters / workers


@dataclass(frozen=True)
class CheckpointChoices:
    """`trainer.gradient_checkpointing: auto` on a GPU: the update's token budget at each layer
    stride the plan considers, fewest recomputed layers first (None: no checkpointing; k: every
    k-th layer), and the tokens a micro-batch of the configured shape needs."""

    budgets: tuple[tuple[int | None, TokenBudget], ...]
    wanted_tokens: int

    def choose(self, device_bytes: float) -> tuple[int | None, TokenBudget]:
        """The first stride at which a configured micro-batch fits; the last (every layer) where
        none does."""
        for every, budget in self.budgets:
            if budget.tokens(device_bytes) >= self.wanted_tokens:
                return every, budget
        return self.budgets[-1]


@dataclass(frozen=True)
class LearnerSpec:
    model_path: str
    agent_index: int
    loss: LossSpec = field(default_factory=LossSpec)
    trust_region: TrustRegionSpec = field(default_factory=TrustRegionSpec)
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    dtype: str = "float32"  # compute dtype; master weights and optimiser state stay float32
    save_dtype: str | None = None  # HF checkpoints and engine weights; None: the compute dtype
    device: str = "cpu"
    micro_batch_size: int = 8
    # a micro-batch's tokens (its trajectories' prompt + response tokens; padded where the
    # model does not pack); `token_budget`: set on a GPU from the memory plan instead (at the
    # chosen stride where `checkpoint_choices` chooses one)
    max_tokens_per_micro_batch: int | None = None
    token_budget: TokenBudget | None = None
    logit_chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    ppo_epochs: int = 1  # passes over the agent's stage batch, each checked by the trust region
    mini_batch_size: int | None = None  # trajectories per optimiser step; None: the whole batch
    checkpoint_every: int | None = None  # gradient checkpointing of every k-th layer; None: off
    checkpoint_choices: CheckpointChoices | None = None  # on a GPU, the plan's stride instead
    # on a GPU under the trust region: the update's budget at the configured stride, which puts
    # the backtracking snapshot on the device where a configured micro-batch fits beside it
    snapshot_budget: TokenBudget | None = None
    fp32_head: bool = True  # the output layer's logits in float32 under autocast
    temperature: float = 1.0
    value_lr: float | None = None  # `gae` mode: a value head fitted at this lr; None: no head
    value_steps: int = 8  # value-head steps per stage (sat_seq.value_steps)
    seed: int = 0
    num_threads: int = 1
    # idle_agents: master weights and AdamW state in host memory except during an update
    # (sharded: FSDP2's CPU offload of parameters, gradients and AdamW state)
    offload: Literal["none", "idle_agents"] = "none"
    workers: int = 1  # W: the agent's learner ranks (FSDP2 over W > 1)
    rank: int = 0  # this learner's rank among them
