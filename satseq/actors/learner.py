"""LearnerActor: one per agent. Holds the agent's model, AdamW and β_i, and runs its
trust-region update (DESIGN §3 step 6); in `gae` mode also the agent's value head. All math
comes from `satseq.algo`.

Precision: the master weights and the optimiser state are float32; forward and backward run
under autocast in `LearnerSpec.dtype` (bfloat16 on GPUs), so an update of 1e-6 relative size is
kept rather than rounded away. Memory: logits exist one chunk of tokens at a time
(`satseq.algo.lm_head`); the KL's π_cur is the stage-start output layer plus the stage-start
hidden states of the batch, taken from the first forward pass, not a copy of the model; the
backtracking snapshot lives in CPU memory. With `offload="idle_agents"` the master weights and
AdamW state live in host memory too between updates (`satseq.actors.residency`).

Sharded (`workers` W > 1): the learner is one of its agent's W ranks (`LearnerRank`), the model
is sharded with FSDP2 and the ranks split each batch's micro-batches between them
(`satseq.actors.sharding`); every method gives the same result on every rank, and the same as
one unsharded learner.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import ray
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from satseq.actors.forward import (
    PolicyTrunk,
    response_hidden_states,
    response_logprobs,
    response_positions,
    scatter_response,
)
from satseq.actors.incarnation import PROCESS_ID
from satseq.actors.residency import Residency, peak_memory_gib, reset_peak_memory
from satseq.actors.sharding import (
    ShardGroup,
    clip_grad_norm_,
    free_address,
    full_state,
    join_group,
    shard_policy,
)
from satseq.actors.trajectory import PaddedBatch, Trajectory, pad_batch
from satseq.actors.value_head import ValueHead
from satseq.actors.weight_transfer import TensorSpec, TransferEndpoint, WeightSender
from satseq.algo.kl import kl_k3, kl_quantile, sequence_kl
from satseq.algo.lm_head import DEFAULT_CHUNK_TOKENS, OutputLayer, chunked_logprobs_and_kl
from satseq.algo.losses import Aggregation, RatioMode, kl_penalty, policy_loss
from satseq.algo.masks import owner_mask
from satseq.algo.projection import (
    chunked_distillation_kl,
    chunked_mixture_kl,
    projection_lambda,
)
from satseq.algo.trust_region import (
    StepDecision,
    StepOutcome,
    TrainingSnapshot,
    TrustRegion,
    local_shard,
    restore_training_state,
    snapshot_training_state,
    trust_region_step,
)
from satseq.files import write_atomically
from satseq.models import load_policy
from satseq.models.loading import TORCH_DTYPES


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
    """The quantile-KL trust region and its β_i (DESIGN §4). enabled=False: plain PPO steps,
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
    max_tokens_per_micro_batch: int | None = None  # padded prompt + response tokens
    logit_chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    update_steps: int = 1
    gradient_checkpointing: bool = False
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


@dataclass(frozen=True)
class UpdateResult:
    """What one agent's update did. logp_hat [N, T]: log-probs of the batch under the weights
    the agent holds afterwards (the stage-start ones where every step was rejected); None, and
    kl_quantile NaN, where the steps were not measured (`TrustRegionSpec.measure`).
    peak_memory_gib: the process's peak allocated device memory during the update, on CUDA;
    None elsewhere (`satseq.actors.residency.peak_memory_gib`)."""

    logp_hat: torch.Tensor | None
    steps: list[StepOutcome]
    loss: float
    clip_fraction: float
    tokens: int
    seconds: float
    peak_memory_gib: float | None = None

    @property
    def backtracks(self) -> int:
        return sum(step.backtracks for step in self.steps)

    @property
    def accepted_steps(self) -> int:
        return sum(step.applied for step in self.steps)

    @property
    def kl_quantile(self) -> float:
        """q of the last attempt of the last step."""
        return self.steps[-1].kl_quantiles[-1] if self.steps else 0.0


@dataclass
class MicroBatch:
    """One micro-batch of an update: its rows of the batch, tensors on the learner's device,
    agent i's token mask [n, T_mb] and its share of the loss's normaliser. A sharded rank's
    stand-in (real=False) has weight 0 and its results are dropped."""

    rows: slice
    batch: PaddedBatch
    mask: torch.Tensor
    weight: float
    real: bool = True


@dataclass
class StageReference:
    """What the exact KL needs of π_cur (the stage-start policy): its output layer, and its last
    hidden states at each micro-batch's response states, filled by the update's first forward
    pass (where π_θ is still π_cur) instead of a second model."""

    layer: OutputLayer | None = None
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # micro-batch → [M, H]


@dataclass(frozen=True)
class Attempt:
    """One optimiser step of an update and the KL check after it."""

    loss: float
    clip_fraction: float
    kl_quantile: float
    logp_new: torch.Tensor | None  # [N, T] under the weights after the step, where measured


@dataclass(frozen=True)
class PolicyStates:
    """A policy at the agent's response states of a batch, as the exact KL needs it: its output
    layer and its last hidden states [M, H] at those M states (row-major over the trajectories'
    own response tokens), on the CPU. What a swap's incoming learner gets of π_cur."""

    layer: OutputLayer
    hidden: torch.Tensor


@dataclass(frozen=True)
class DistillResult:
    """What the Stage-0 projection did: λ of the target π_λ, the mean per-state
    KL(π_θ ‖ π_cur) before and after distilling towards it, and the optimiser steps taken."""

    lam: float
    kl_before: float
    kl: float
    steps: int
    met_budget: bool


def while_resident(method: Callable) -> Callable:
    """A `Learner` method that steps or loads: it runs with the master weights and AdamW state
    on the device, which go back to host memory after it when the learner offloads."""

    @functools.wraps(method)
    def run(self: Learner, *args: Any, **kwargs: Any) -> Any:
        self.residency.ensure_resident()
        result = method(self, *args, **kwargs)
        self.residency.offload()
        return result

    return run


def forward_pass(method: Callable) -> Callable:
    """A `Learner` method that only runs the model forward: an offloaded learner's weights are
    on the device for its span only (`Residency.forward_weights`)."""

    @functools.wraps(method)
    def run(self: Learner, *args: Any, **kwargs: Any) -> Any:
        with self.residency.forward_weights():
            result = method(self, *args, **kwargs)
        self._reshard()
        return result

    return run


class Learner:
    """One agent's model and optimiser. Plain class; `LearnerActor` is its Ray actor."""

    def __init__(self, spec: LearnerSpec):
        self.spec = spec
        torch.set_num_threads(spec.num_threads)
        torch.manual_seed(spec.seed)
        self.compute_dtype = TORCH_DTYPES[spec.dtype]
        self.save_dtype = TORCH_DTYPES[spec.save_dtype or spec.dtype]
        self.group = ShardGroup(spec.rank, spec.workers)
        self.model, self.tokenizer = load_policy(
            spec.model_path, dtype="float32", device=spec.device
        )
        self.device = next(self.model.parameters()).device
        if spec.gradient_checkpointing:
            self.model.config.use_cache = False
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self.model.train()
        self.trunk = PolicyTrunk(self.model)  # what every forward pass calls
        if self.group.sharded:
            shard_policy(self.trunk, spec.workers, self.device, spec.offload == "idle_agents")
        self.optimizer = torch.optim.AdamW(
            self.trunk.parameters(), lr=spec.optimizer.lr, weight_decay=spec.optimizer.weight_decay
        )
        tr = spec.trust_region
        self.region = TrustRegion(
            target_kl=tr.target_kl,
            alpha=tr.alpha,
            max_backtracks=tr.max_backtracks,
            beta=tr.kl_coef,
            beta_growth=tr.beta_growth,
            step_shrink=tr.step_shrink,
            on_exhausted=tr.on_exhausted,
        )
        self.snapshot = TrainingSnapshot()  # its CPU buffers are reused by every step
        self.pad_token_id = self.tokenizer.pad_token_id
        self.value_head = (
            ValueHead(self.model.config.hidden_size, spec.value_lr, self.device)
            if spec.value_lr is not None
            else None
        )
        self.residency = Residency(  # sharded, FSDP2 offloads instead
            self.model,
            self.optimizer,
            self.compute_dtype,
            spec.offload == "idle_agents" and not self.group.sharded,
        )
        self.residency.offload()
        self.sender: WeightSender | None = None  # `open_weight_transfer`'s

    # --- forward passes ------------------------------------------------------------------------

    def autocast(self) -> contextlib.AbstractContextManager:
        """Forward passes in the compute dtype over the float32 master weights."""
        return torch.autocast(
            self.device.type,
            dtype=self.compute_dtype,
            enabled=self.compute_dtype != torch.float32,
        )

    def _micro_batches(self, trajectories: list[Trajectory]) -> Iterator[tuple[slice, PaddedBatch]]:
        """Consecutive micro-batches of at most `micro_batch_size` trajectories and, if set,
        `max_tokens_per_micro_batch` padded tokens (a longer trajectory goes alone), on the CPU."""
        spec = self.spec
        budget = spec.max_tokens_per_micro_batch
        start = 0
        while start < len(trajectories):
            end, longest = start, 0
            while end < len(trajectories) and end - start < spec.micro_batch_size:
                t = trajectories[end]
                length = max(longest, len(t.prompt_ids) + len(t.response_ids))
                if budget is not None and end > start and (end - start + 1) * length > budget:
                    break
                end, longest = end + 1, length
            rows = slice(start, end)
            yield rows, pad_batch(trajectories[rows], self.pad_token_id)
            start = end

    @torch.no_grad()
    def _per_token(
        self, trajectories: list[Trajectory], compute: Callable[[PaddedBatch], torch.Tensor]
    ) -> torch.Tensor:
        """compute(micro-batch) [n, T_mb] gathered into [N, T] (T = longest response), on CPU;
        sharded, each rank computes its share of the micro-batches."""
        T = max(len(t.response_ids) for t in trajectories)
        out = torch.zeros(len(trajectories), max(T, 1), device="cpu")
        computed = []
        for (rows, batch), real in self.group.mine(list(self._micro_batches(trajectories))):
            with self.autocast():
                values = compute(batch.to(self.device))
            if real:
                computed.append((rows, values.float().cpu()))
        for rows, values in (part for parts in self.group.gather(computed) for part in parts):
            out[rows, : values.shape[1]] = values
        return out

    @forward_pass
    def logprobs(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """Teacher-forced log-probs at the sampling temperature, [N, T]."""
        spec = self.spec
        return self._per_token(
            trajectories,
            lambda batch: response_logprobs(
                self.trunk, batch, spec.temperature, spec.logit_chunk_tokens
            ),
        )

    @forward_pass
    def values(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """`gae` mode: V(s_t) before every response token, [N, T]."""
        return self._per_token(
            trajectories,
            lambda batch: self.value_head(response_hidden_states(self.trunk, batch)[0]),
        )

    @forward_pass
    def fit_values(self, trajectories: list[Trajectory], returns: torch.Tensor) -> float:
        """`gae` mode: `value_steps` steps of the value head towards the GAE returns [N, T] on
        the agent's tokens, with the current (updated) weights' hidden states. Returns the
        loss before the last step. Only the value head trains: an offloaded learner stays so.
        Sharded, every rank fits its own copy of the head on the whole batch."""
        hidden, targets, masks = [], [], []
        with torch.no_grad(), self.autocast():
            for rows, batch in self._micro_batches(trajectories):
                batch = batch.to(self.device)
                hidden.append(response_hidden_states(self.trunk, batch)[0])
                masks.append(
                    owner_mask(batch.owner_ids, [self.spec.agent_index], batch.response_mask)
                )
                targets.append(returns[rows, : masks[-1].shape[1]].to(masks[-1].device))
        loss = float("nan")
        for _ in range(self.spec.value_steps):
            loss = self.value_head.fit(hidden, targets, masks)
        return loss

    # --- the update ----------------------------------------------------------------------------

    @while_resident
    def update(
        self,
        trajectories: list[Trajectory],
        logp_cur: torch.Tensor | None,
        A: torch.Tensor,
        c: torch.Tensor,
    ) -> UpdateResult:
        """`update_steps` trust-region steps on the agent's tokens of `trajectories`.

        logp_cur [N, T]: behaviour log-probs (stage-start weights, sampling temperature); None
        when the behaviour policy is this learner's weights as they are now: they are then the
        first forward pass of the update, detached (that pass runs those weights on this batch,
        as a `logprobs` call would, so the separate pass is saved).
        A, c [N]: advantages and truncated IS weights per trajectory.
        """
        started = time.perf_counter()
        reset_peak_memory(self.device)
        spec = self.spec
        micro_batches, tokens = self._update_micro_batches(trajectories)
        reference = StageReference() if spec.trust_region.kl_estimator == "exact" else None
        record_behaviour = logp_cur is None
        if record_behaviour:  # filled by the first attempt's forward pass
            T = max((len(t.response_ids) for t in trajectories), default=1)
            logp_cur = torch.zeros(len(trajectories), max(T, 1), device="cpu")
        logp_hat = None  # the agent's tokens under the weights of the last applied step
        steps: list[StepOutcome] = []
        attempts: list[Attempt] = []
        for step in range(spec.update_steps if micro_batches else 0):
            outcome, step_attempts = self._step(
                micro_batches, logp_cur, A, c, reference, step, record_behaviour and step == 0
            )
            steps.append(outcome)
            attempts += step_attempts
            if outcome.applied:
                logp_hat = step_attempts[-1].logp_new
        if logp_hat is None and spec.trust_region.measure:  # every step rejected
            logp_hat = logp_cur.clone()
        return UpdateResult(
            logp_hat=logp_hat,
            steps=steps,
            loss=attempts[-1].loss if attempts else 0.0,
            clip_fraction=attempts[-1].clip_fraction if attempts else 0.0,
            tokens=tokens,
            seconds=time.perf_counter() - started,
            peak_memory_gib=peak_memory_gib(self.device),
        )

    def _step(
        self,
        micro_batches: list[MicroBatch],
        logp_cur: torch.Tensor,
        A: torch.Tensor,
        c: torch.Tensor,
        reference: StageReference | None,
        step: int,
        record_behaviour: bool,
    ) -> tuple[StepOutcome, list[Attempt]]:
        """One step of the update. With the trust region: attempts until q ≤ target_kl, each
        failure restoring the weights and optimiser and growing β (DESIGN §4); without: one
        attempt, always kept (q is still measured). Returns the outcome and its attempts.
        record_behaviour: the first attempt writes its log-probs into logp_cur."""
        attempts: list[Attempt] = []

        def attempt(beta: float, step_scale: float) -> float:
            record = record_behaviour and not attempts  # a backtrack restores those weights
            attempts.append(
                self._attempt(
                    micro_batches, logp_cur, A, c, reference, step, beta, step_scale, record
                )
            )
            return attempts[-1].kl_quantile

        if not self.spec.trust_region.enabled:
            return StepOutcome(StepDecision.ACCEPT, 0, [attempt(0.0, 1.0)], 0.0), attempts
        outcome = trust_region_step(
            self.region,
            attempt,
            save=self._snapshot,
            restore=self._restore,
        )
        return outcome, attempts

    def _snapshot(self) -> TrainingSnapshot:
        self._reshard()
        return snapshot_training_state(self.model, self.optimizer, into=self.snapshot)

    def _restore(self, snapshot: TrainingSnapshot) -> None:
        """Back to the weights and optimiser state of `snapshot` (a backtrack)."""
        self._reshard()
        restore_training_state(self.model, self.optimizer, snapshot)

    def _reshard(self) -> None:
        """Sharded: drop the gathered copy of the root's weights (embeddings, norm, output
        layer), which FSDP2 keeps after a forward without backward, so that the parameters are
        the shards again (what snapshots, checkpoints and restores read and write); the next
        forward gathers them afresh."""
        if self.group.sharded:
            self.trunk.reshard()

    def _update_micro_batches(self, trajectories: list[Trajectory]) -> tuple[list[MicroBatch], int]:
        """This rank's micro-batches that hold agent i's tokens (sharded: its share, with
        stand-ins), padded once for every attempt, each weighted by its share of the loss's
        normaliser (tokens or sequences) over the whole batch; and the agent's token count."""
        micro_batches = []
        for rows, batch in self._micro_batches(trajectories):
            mask = owner_mask(batch.owner_ids, [self.spec.agent_index], batch.response_mask)
            count = (
                mask.sum()
                if self.spec.loss.aggregation == "token_mean"
                else (mask.sum(-1) > 0).sum()
            )
            if count > 0:
                micro_batches.append(MicroBatch(rows, batch, mask, float(count)))
        total = sum(mb.weight for mb in micro_batches)
        tokens = int(sum(float(mb.mask.sum()) for mb in micro_batches))
        mine = []
        for mb, real in self.group.mine(micro_batches):
            weight = mb.weight / total if real else 0.0
            mine.append(
                MicroBatch(mb.rows, mb.batch.to(self.device), mb.mask.to(self.device), weight, real)
            )
        return mine, tokens

    def _attempt(
        self,
        micro_batches: list[MicroBatch],
        logp_cur: torch.Tensor,
        A: torch.Tensor,
        c: torch.Tensor,
        reference: StageReference | None,
        step: int,
        beta: float,
        step_scale: float,
        record_behaviour: bool,
    ) -> Attempt:
        """One AdamW step on the loss of DESIGN §4 with KL penalty β and the learning rate
        scaled by step_scale, then the KL quantile q and the new log-probs. record_behaviour:
        the weights are still π_old's, and its log-probs (this forward pass's, detached) are
        written into logp_cur before the loss reads them."""
        spec = self.spec
        for group in self.optimizer.param_groups:
            group["lr"] = spec.optimizer.lr * step_scale
        self.optimizer.zero_grad(set_to_none=True)
        # The first step starts at π_cur, where KL(π_θ ‖ π_cur) and its gradient are exactly 0
        # (a backtrack restores that point): only later steps pay for the penalty.
        penalise = beta > 0 and step > 0
        loss_sum = torch.zeros((), device=self.device)
        clip_sum = 0.0
        recorded = []
        for index, mb in enumerate(micro_batches):
            with self.autocast():
                logp, per_token_kl = self._logprobs_and_kl(
                    mb, index, logp_cur, reference, record_reference=step == 0, with_kl=penalise
                )
            if record_behaviour:
                logp_cur[mb.rows, : logp.shape[1]] = (logp.detach() * mb.mask).float().cpu()
                if mb.real:
                    recorded.append((mb.rows, logp_cur[mb.rows, : logp.shape[1]]))
            pl = policy_loss(
                logp,
                logp_cur[mb.rows, : mb.mask.shape[1]].to(self.device),
                A[mb.rows].to(self.device),
                mb.mask,
                c=c[mb.rows].to(self.device),
                ratio=spec.loss.ratio,
                eps_low=spec.loss.eps_low,
                eps_high=spec.loss.eps_high,
                dual_clip=spec.loss.dual_clip,
                aggregation=spec.loss.aggregation,
            )
            loss = pl.loss
            if penalise:
                loss = loss + kl_penalty(per_token_kl, mb.mask, beta)
            (loss * (mb.weight * self.group.world)).backward()  # FSDP2 averages over ranks
            loss_sum += loss.detach() * mb.weight
            clip_sum += pl.clip_fraction * mb.weight
        for rows, values in (part for parts in self.group.gather(recorded) for part in parts):
            logp_cur[rows, : values.shape[1]] = values  # sharded: the other ranks' rows too
        clip_grad_norm_(list(self.trunk.parameters()), spec.optimizer.grad_clip)
        self.optimizer.step()
        q, logp_new = (
            self._kl_quantile_and_logprobs(micro_batches, logp_cur, reference)
            if spec.trust_region.measure
            else (float("nan"), None)
        )
        return Attempt(self.group.sum(float(loss_sum)), self.group.sum(clip_sum), q, logp_new)

    def _logprobs_and_kl(
        self,
        mb: MicroBatch,
        index: int,
        logp_cur: torch.Tensor,
        reference: StageReference | None,
        record_reference: bool = False,
        with_kl: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log π_θ of the micro-batch's response tokens [n, T_mb] and, if with_kl, the per-token
        KL(π_θ ‖ π_cur) [n, T_mb]: exact over the vocabulary, or k3 on the sampled tokens."""
        where = response_positions(mb.batch)
        hidden, layer = response_hidden_states(self.trunk, mb.batch)
        hidden = hidden[where]
        if reference is not None and record_reference:
            if reference.layer is None:  # before the first step: π_cur's
                reference.layer = layer.detached_copy(self.compute_dtype)
            if index not in reference.hidden:
                reference.hidden[index] = hidden.detach().to(self.compute_dtype)
        exact = with_kl and reference is not None
        logp, kl = chunked_logprobs_and_kl(
            hidden,
            mb.batch.response_ids[where],
            layer,
            self.spec.temperature,
            reference_hidden=reference.hidden[index] if exact else None,
            reference=reference.layer if exact else None,
            chunk_tokens=self.spec.logit_chunk_tokens,
        )
        logp = scatter_response(logp, where)
        if not with_kl:
            return logp, None
        if exact:
            return logp, scatter_response(kl, where)
        return logp, kl_k3(logp, logp_cur[mb.rows, : logp.shape[1]].to(logp.device))

    @torch.no_grad()
    def _kl_quantile_and_logprobs(
        self,
        micro_batches: list[MicroBatch],
        logp_cur: torch.Tensor,
        reference: StageReference | None,
    ) -> tuple[float, torch.Tensor]:
        """After a step: q over the agent's sequences (of every rank), and the new log-probs
        [N, T] (rows without agent i's tokens keep logp_cur)."""
        computed = []
        for index, mb in enumerate(micro_batches):
            with self.autocast():
                logp, per_token_kl = self._logprobs_and_kl(mb, index, logp_cur, reference)
            if mb.real:
                owns = mb.mask.sum(-1) > 0
                seq_kl = sequence_kl(per_token_kl, mb.mask)[owns]
                computed.append((mb.rows, logp.cpu(), seq_kl.float().cpu()))
        logp_new = logp_cur.clone()
        seq_kls = []
        for rows, logp, seq_kl in (part for parts in self.group.gather(computed) for part in parts):
            logp_new[rows, : logp.shape[1]] = logp
            seq_kls.append(seq_kl)
        q = kl_quantile(torch.cat(seq_kls), self.spec.trust_region.alpha)
        return q, logp_new

    # --- the Stage-0 projection of a swapped-in agent ---------------------------------------------

    def _own_states(self, batch: PaddedBatch) -> torch.Tensor:
        """Bool [n, T]: the response states whose token the agent wrote."""
        own = owner_mask(batch.owner_ids, [self.spec.agent_index], batch.response_mask)
        return response_positions(batch) & (own > 0)

    @torch.no_grad()
    def _own_hidden_states(
        self, batches: list[PaddedBatch]
    ) -> tuple[list[torch.Tensor], OutputLayer]:
        """Per micro-batch (on the device), the last hidden states at the agent's response
        states, [M_mb, H], and a frozen copy of the output layer."""
        hidden = []
        for batch in batches:
            with self.autocast():
                states, layer = response_hidden_states(self.trunk, batch)
            hidden.append(states[self._own_states(batch)].to(self.compute_dtype))
        return hidden, layer.detached_copy(self.compute_dtype)

    def _device_batches(self, trajectories: list[Trajectory]) -> list[PaddedBatch]:
        return [batch.to(self.device) for _, batch in self._micro_batches(trajectories)]

    @forward_pass
    def policy_states(self, trajectories: list[Trajectory]) -> PolicyStates:
        """This policy (π_cur of a swap) at the agent's response states of `trajectories`."""
        hidden, layer = self._own_hidden_states(self._device_batches(trajectories))
        bias = None if layer.bias is None else layer.bias.cpu()
        return PolicyStates(OutputLayer(layer.weight.cpu(), bias), torch.cat(hidden).cpu())

    @while_resident
    def distill(
        self,
        trajectories: list[Trajectory],
        current: PolicyStates,
        delta0: float,
        max_steps: int,
        lr: float,
        target_fraction: float = 1.0,
    ) -> DistillResult:
        """The Stage-0 projection: this (incoming) model π_pre distilled towards the per-state
        target π_λ ∝ π_pre^{1/(1+λ)} π_cur^{λ/(1+λ)} at the agent's response states of
        `trajectories`, λ bisected so that the mean KL(π_λ ‖ π_cur) ≤ target_fraction·δ0.

        The loss is the exact vocabulary KL(π_λ ‖ π_θ), token-mean, a chunk of states at a
        time; steps go on until the measured mean KL(π_θ ‖ π_cur) ≤ δ0 or `max_steps` are
        taken. It uses an AdamW of its own, so the learner's optimiser stays fresh. Sharded,
        every rank distils on the whole batch.
        """
        spec = self.spec
        micro_batches = self._device_batches(trajectories)
        where = [self._own_states(batch) for batch in micro_batches]
        counts = [int(w.sum()) for w in where]
        if current.hidden.shape[0] != sum(counts):
            raise ValueError(
                f"π_cur was given at {current.hidden.shape[0]} states, the batch has {sum(counts)}"
            )
        hidden_pre, pre = self._own_hidden_states(micro_batches)
        cur = _on_device(current.layer, self.device)
        hidden_cur = list(current.hidden.to(self.device).split(counts))
        total = max(sum(counts), 1)

        def mean_state_kl(per_micro_batch: Callable[[int], torch.Tensor]) -> float:
            with torch.no_grad(), self.autocast():
                return sum(float(per_micro_batch(k).sum()) for k in range(len(counts))) / total

        def kl_at(lam: float) -> float:  # mean per-state KL(π_λ ‖ π_cur)
            return mean_state_kl(
                lambda k: chunked_mixture_kl(
                    pre,
                    hidden_pre[k],
                    cur,
                    hidden_cur[k],
                    lam,
                    spec.temperature,
                    spec.logit_chunk_tokens,
                )
            )

        def policy_at(k: int) -> tuple[torch.Tensor, OutputLayer]:  # π_θ at batch k's states
            hidden, layer = response_hidden_states(self.trunk, micro_batches[k])
            return hidden[where[k]], layer

        def state_kl(k: int) -> torch.Tensor:  # per-state KL(π_θ ‖ π_cur)
            hidden, layer = policy_at(k)
            return chunked_logprobs_and_kl(
                hidden,
                micro_batches[k].response_ids[where[k]],
                layer,
                spec.temperature,
                reference_hidden=hidden_cur[k],
                reference=cur,
                chunk_tokens=spec.logit_chunk_tokens,
            )[1]

        lam = projection_lambda(kl_at, target_fraction * delta0)
        optimizer = torch.optim.AdamW(self.trunk.parameters(), lr=lr, weight_decay=0.0)
        measured_kl = functools.partial(mean_state_kl, state_kl)  # mean KL(π_θ ‖ π_cur)
        kl_before = kl = measured_kl()
        steps = 0
        while kl > delta0 and steps < max_steps:
            optimizer.zero_grad(set_to_none=True)
            for k in range(len(micro_batches)):
                with self.autocast():
                    hidden, layer = policy_at(k)
                    loss = (
                        chunked_distillation_kl(
                            layer,
                            hidden,
                            pre,
                            hidden_pre[k],
                            cur,
                            hidden_cur[k],
                            lam,
                            spec.temperature,
                            spec.logit_chunk_tokens,
                        ).sum()
                        / total
                    )
                loss.backward()
            clip_grad_norm_(list(self.trunk.parameters()), spec.optimizer.grad_clip)
            optimizer.step()
            steps += 1
            kl = measured_kl()
        return DistillResult(lam, kl_before, kl, steps, kl <= delta0)

    # --- weights and state ---------------------------------------------------------------------

    def weight_buckets(self, bucket_mb: float) -> Iterator[dict[str, torch.Tensor]]:
        """The current weights as CPU tensors in the save dtype, named as in the HF model (what
        rollout engines load), in buckets of about `bucket_mb` MiB: one tensor gathered at a
        time, never the whole model at once. A decoder layer's tensors share a bucket (an
        engine that fuses them, vLLM, reprocesses a layer once it has all of it), so a bucket
        can pass `bucket_mb` by at most a layer. Sharded, rank 0 yields them; the other ranks
        take part in the gathers and yield nothing."""
        limit = bucket_mb * 2**20
        bucket: dict[str, torch.Tensor] = {}
        size, unit = 0, None
        for name, tensor in self._weights_to_send(torch.device("cpu")):
            if self.group.rank != 0:
                continue
            if bucket and size + tensor.nbytes > limit and _layer_of(name) != unit:
                yield bucket
                bucket, size = {}, 0
            bucket[name] = tensor
            size += tensor.nbytes
            unit = _layer_of(name)
        if bucket:
            yield bucket

    def _weights_to_send(self, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, weight in the save dtype on `device`), one gathered at a time (sharded:
        every rank takes part in each gather)."""
        self._reshard()
        for name, tensor in full_state(self.model):
            yield name, tensor.to(device, self.save_dtype, copy=True)

    def weight_manifest(self) -> list[TensorSpec]:
        """What `send_weights` sends, in order (the engines allocate from it)."""
        dtype = str(self.save_dtype).removeprefix("torch.")
        return [
            TensorSpec(name, dtype, tuple(tensor.shape))  # a shard's shape is the whole one
            for name, tensor in self.model.state_dict().items()
        ]

    def transfer_address(self) -> str:
        """host:port where rank 0 can host a weight-transfer group."""
        return free_address()

    def open_weight_transfer(self, endpoint: TransferEndpoint) -> None:
        """Rank 0 forms the weight-transfer group with the engines at `endpoint` (leaving an
        earlier one); the other ranks only take part in `send_weights`' gathers."""
        if self.group.rank != 0:
            return
        self.close_weight_transfer()
        self.sender = WeightSender(endpoint)

    def send_weights(self, manifest: list[TensorSpec]) -> float:
        """Broadcast the current weights to the engines of the transfer group (they receive
        with `VLLMEngine.receive_weights`); the seconds it took."""
        started = time.perf_counter()
        if self.group.rank > 0:  # its part of each gather, nothing to send
            for _ in self._weights_to_send(self.device):
                pass
        elif self.sender is None:
            raise RuntimeError("no weight-transfer group: call open_weight_transfer first")
        else:
            on_device = self.sender.endpoint.backend == "nccl"
            sent = self._weights_to_send(self.device if on_device else torch.device("cpu"))
            try:
                self.sender.send(manifest, sent)
            except Exception:
                self.close_weight_transfer()  # its closed sockets release the waiting engines
                raise
        return time.perf_counter() - started

    def close_weight_transfer(self) -> None:
        if self.sender is not None:
            self.sender.close()
        self.sender = None

    def weights(self) -> dict[str, torch.Tensor]:
        """All the weights in one dict (`weight_buckets` merged): for checks and saving."""
        buckets = self.weight_buckets(float("inf"))
        return {name: tensor for bucket in buckets for name, tensor in bucket.items()}

    def save_pretrained(self, directory: str) -> str:
        """An HF directory (weights in the save dtype + tokenizer) loadable by transformers and
        vLLM; sharded, consolidated from the shards and written by rank 0."""
        weights = self.weights()
        if self.group.rank != 0:
            return directory
        Path(directory).mkdir(parents=True, exist_ok=True)
        seen = set()
        for name, tensor in self.model.state_dict().items():  # tied weights are saved once
            if local_shard(tensor).data_ptr() in seen:
                del weights[name]
            seen.add(local_shard(tensor).data_ptr())
        self.model.save_pretrained(directory, state_dict=weights)
        config = copy.deepcopy(self.model.config)
        config.dtype = self.save_dtype  # save_pretrained wrote the master weights' float32
        config.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        return directory

    def state_dict(self) -> dict[str, Any]:
        """Everything resume needs: float32 master weights, optimiser, β_i, the value head and
        torch's RNG. The weights are the live tensors (torch.save copies them to the file);
        sharded, this rank's shards (`torch.distributed.checkpoint` state)."""
        self._reshard()
        return {
            "model": self.model.state_dict(),
            "optimizer": (
                get_optimizer_state_dict(self.trunk, self.optimizer)
                if self.group.sharded
                else self.optimizer.state_dict()
            ),
            "trust_region": self.region.state_dict(),
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "rng": torch.get_rng_state(),
        }

    @while_resident  # AdamW's state takes its parameters' dtype and device
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reshard()
        if self.group.sharded:  # the shards were loaded in place (`load_state`)
            set_optimizer_state_dict(self.trunk, self.optimizer, state["optimizer"])
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.region.load_state_dict(state["trust_region"])
        if self.value_head is not None:
            self.value_head.load_state_dict(state["value_head"])
        torch.set_rng_state(state["rng"])

    def save_state(self, path: str) -> str:
        """Write `state_dict()` to `path` atomically (a checkpoint's learner file); nothing of it
        is returned through the caller. Sharded: every rank writes its shards into the
        directory `path` (`torch.distributed.checkpoint`), made whole under another name and
        renamed by rank 0 once all have written."""
        if not self.group.sharded:
            write_atomically(path, lambda handle: torch.save(self.state_dict(), handle))
            return path
        partial = self.group.gather(f"{path}.partial-{uuid.uuid4().hex}")[0]
        dcp.save(self.state_dict(), checkpoint_id=partial)  # ends with a barrier
        if self.group.rank == 0:
            shutil.rmtree(path, ignore_errors=True)  # a retried stage's
            Path(partial).rename(path)
        self.group.gather(None)  # the checkpoint is whole on return, on every rank
        return path

    def load_state(self, path: str) -> None:
        """Load what `save_state` wrote."""
        if not self.group.sharded:
            self.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))
            return
        self._reshard()
        state = self.state_dict()
        dcp.load(state, checkpoint_id=path)  # into this rank's shards, in place
        self.load_state_dict(state)

    def reset(self) -> None:
        """Back to what the constructor made of `spec`: its weights, a fresh optimiser and β,
        the seed's RNG (a retry of stage 0). The old model is freed before the new one loads;
        a rank stays in its group."""
        spec = self.spec
        self.__dict__.clear()
        Learner.__init__(self, spec)

    def ready(self) -> bool:
        return True

    def incarnation(self) -> str:
        """The process this learner runs in: a new one after Ray restarted it (from its initial
        weights, whatever the run had trained)."""
        return PROCESS_ID


def _on_device(layer: OutputLayer, device: torch.device) -> OutputLayer:
    bias = None if layer.bias is None else layer.bias.to(device)
    return OutputLayer(layer.weight.to(device), bias)


def _layer_of(name: str) -> str:
    """The decoder layer a weight belongs to ("model.layers.3"), or the weight's own name."""
    match = re.match(r"(.*\.layers\.\d+)\.", name)
    return match.group(1) if match else name


class LearnerRank(Learner):
    """One of a sharded agent's W learner ranks (`LearnerRankActor`). It builds its learner only
    once the ranks have formed their process group (`join_group`), so a rank Ray restarts
    after a loss waits for the group to form again instead of blocking its constructor."""

    def __init__(self, spec: LearnerSpec):
        self.spec = spec

    def rendezvous_address(self) -> str:
        """Rank 0: a host:port for the group to meet at."""
        return free_address()

    def join_group(self, address: str) -> bool:
        """(Re-)form the group at `address` with the other ranks, and build this rank's learner
        (the model sharded afresh: after a loss the caller loads the stage's state)."""
        spec = self.spec
        self.__dict__.clear()
        self.spec = spec
        join_group(address, ShardGroup(spec.rank, spec.workers), torch.device(spec.device))
        Learner.__init__(self, spec)
        return True


LearnerActor = ray.remote(Learner)
LearnerRankActor = ray.remote(LearnerRank)
