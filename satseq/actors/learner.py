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
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import ray
import torch

from satseq.actors.forward import (
    output_layer,
    response_hidden_states,
    response_logprobs,
    response_positions,
    scatter_response,
)
from satseq.actors.residency import Residency, peak_memory_gib, reset_peak_memory
from satseq.actors.trajectory import PaddedBatch, Trajectory, pad_batch
from satseq.actors.value_head import ValueHead
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
    no KL penalty, no backtracking (SPO, GRPO); q is still measured and logged. kl_estimator:
    the KL of the penalty and of q, exact over the vocabulary or k3 on the sampled tokens."""

    enabled: bool = True
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
    offload: Literal["none", "idle_agents"] = "none"


@dataclass(frozen=True)
class UpdateResult:
    """What one agent's update did. logp_hat [N, T]: log-probs of the batch under the weights
    the agent holds afterwards (the stage-start ones where every step was rejected).
    peak_memory_gib: the process's peak allocated device memory during the update, on CUDA;
    None elsewhere (`satseq.actors.residency.peak_memory_gib`)."""

    logp_hat: torch.Tensor
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
    agent i's token mask [n, T_mb] and its share of the loss's normaliser."""

    rows: slice
    batch: PaddedBatch
    mask: torch.Tensor
    weight: float


@dataclass
class StageReference:
    """What the exact KL needs of π_cur (the stage-start policy): its output layer, and its last
    hidden states at each micro-batch's response states, filled by the update's first forward
    pass (where π_θ is still π_cur) instead of a second model."""

    layer: OutputLayer
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # micro-batch → [M, H]


@dataclass(frozen=True)
class Attempt:
    """One optimiser step of an update and the KL check after it."""

    loss: float
    clip_fraction: float
    kl_quantile: float
    logp_new: torch.Tensor  # [N, T] under the weights after the step


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
            return method(self, *args, **kwargs)

    return run


class Learner:
    """One agent's model and optimiser. Plain class; `LearnerActor` is its Ray actor."""

    def __init__(self, spec: LearnerSpec):
        self.spec = spec
        torch.set_num_threads(spec.num_threads)
        torch.manual_seed(spec.seed)
        self.compute_dtype = TORCH_DTYPES[spec.dtype]
        self.save_dtype = TORCH_DTYPES[spec.save_dtype or spec.dtype]
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
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=spec.optimizer.lr, weight_decay=spec.optimizer.weight_decay
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
        self.residency = Residency(
            self.model, self.optimizer, self.compute_dtype, spec.offload == "idle_agents"
        )
        self.residency.offload()

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
        `max_tokens_per_micro_batch` padded tokens (a longer trajectory goes alone)."""
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
            yield rows, pad_batch(trajectories[rows], self.pad_token_id).to(self.device)
            start = end

    @torch.no_grad()
    def _per_token(
        self, trajectories: list[Trajectory], compute: Callable[[PaddedBatch], torch.Tensor]
    ) -> torch.Tensor:
        """compute(micro-batch) [n, T_mb] gathered into [N, T] (T = longest response), on CPU."""
        T = max(len(t.response_ids) for t in trajectories)
        out = torch.zeros(len(trajectories), max(T, 1), device="cpu")
        for rows, batch in self._micro_batches(trajectories):
            with self.autocast():
                values = compute(batch)
            out[rows, : values.shape[1]] = values.float().cpu()
        return out

    @forward_pass
    def logprobs(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """Teacher-forced log-probs at the sampling temperature, [N, T]."""
        spec = self.spec
        return self._per_token(
            trajectories,
            lambda batch: response_logprobs(
                self.model, batch, spec.temperature, spec.logit_chunk_tokens
            ),
        )

    @forward_pass
    def values(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """`gae` mode: V(s_t) before every response token, [N, T]."""
        return self._per_token(
            trajectories, lambda batch: self.value_head(response_hidden_states(self.model, batch))
        )

    @forward_pass
    def fit_values(self, trajectories: list[Trajectory], returns: torch.Tensor) -> float:
        """`gae` mode: `value_steps` steps of the value head towards the GAE returns [N, T] on
        the agent's tokens, with the current (updated) weights' hidden states. Returns the
        loss before the last step. Only the value head trains: an offloaded learner stays so."""
        hidden, targets, masks = [], [], []
        with torch.no_grad(), self.autocast():
            for rows, batch in self._micro_batches(trajectories):
                hidden.append(response_hidden_states(self.model, batch))
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
        micro_batches = self._update_micro_batches(trajectories)
        tokens = int(sum(float(mb.mask.sum()) for mb in micro_batches))
        exact_kl = spec.trust_region.kl_estimator == "exact"
        reference = (
            StageReference(output_layer(self.model).detached_copy(self.compute_dtype))
            if exact_kl
            else None
        )
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
        return UpdateResult(
            logp_hat=logp_cur.clone() if logp_hat is None else logp_hat,
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
            save=lambda: snapshot_training_state(self.model, self.optimizer, into=self.snapshot),
            restore=lambda snapshot: restore_training_state(self.model, self.optimizer, snapshot),
        )
        return outcome, attempts

    def _update_micro_batches(self, trajectories: list[Trajectory]) -> list[MicroBatch]:
        """The micro-batches that hold agent i's tokens, padded once for every attempt, each
        weighted by its share of the loss's normaliser (tokens or sequences)."""
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
        for mb in micro_batches:
            mb.weight /= total
        return micro_batches

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
        for index, mb in enumerate(micro_batches):
            with self.autocast():
                logp, per_token_kl = self._logprobs_and_kl(
                    mb, index, logp_cur, reference, record_reference=step == 0, with_kl=penalise
                )
            if record_behaviour:
                logp_cur[mb.rows, : logp.shape[1]] = (logp.detach() * mb.mask).float().cpu()
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
            (loss * mb.weight).backward()
            loss_sum += loss.detach() * mb.weight
            clip_sum += pl.clip_fraction * mb.weight
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), spec.optimizer.grad_clip)
        self.optimizer.step()
        q, logp_new = self._kl_quantile_and_logprobs(micro_batches, logp_cur, reference)
        return Attempt(float(loss_sum), clip_sum, q, logp_new)

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
        hidden = response_hidden_states(self.model, mb.batch)[where]
        if reference is not None and record_reference and index not in reference.hidden:
            reference.hidden[index] = hidden.detach().to(self.compute_dtype)
        exact = with_kl and reference is not None
        logp, kl = chunked_logprobs_and_kl(
            hidden,
            mb.batch.response_ids[where],
            output_layer(self.model),
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
        """After a step: q over the agent's sequences, and the new log-probs [N, T] (rows
        without agent i's tokens keep logp_cur)."""
        seq_kls = []
        logp_new = logp_cur.clone()
        for index, mb in enumerate(micro_batches):
            with self.autocast():
                logp, per_token_kl = self._logprobs_and_kl(mb, index, logp_cur, reference)
            logp_new[mb.rows, : logp.shape[1]] = logp.cpu()
            owns = mb.mask.sum(-1) > 0
            seq_kls.append(sequence_kl(per_token_kl, mb.mask)[owns].float().cpu())
        q = kl_quantile(torch.cat(seq_kls), self.spec.trust_region.alpha)
        return q, logp_new

    # --- the Stage-0 projection of a swapped-in agent ---------------------------------------------

    def _own_states(self, batch: PaddedBatch) -> torch.Tensor:
        """Bool [n, T]: the response states whose token the agent wrote."""
        own = owner_mask(batch.owner_ids, [self.spec.agent_index], batch.response_mask)
        return response_positions(batch) & (own > 0)

    @torch.no_grad()
    def _own_hidden_states(self, trajectories: list[Trajectory]) -> list[torch.Tensor]:
        """Per micro-batch, the last hidden states at the agent's response states, [M_mb, H]."""
        hidden = []
        for _, batch in self._micro_batches(trajectories):
            with self.autocast():
                states = response_hidden_states(self.model, batch)[self._own_states(batch)]
            hidden.append(states.to(self.compute_dtype))
        return hidden

    @forward_pass
    def policy_states(self, trajectories: list[Trajectory]) -> PolicyStates:
        """This policy (π_cur of a swap) at the agent's response states of `trajectories`."""
        layer = output_layer(self.model).detached_copy(self.compute_dtype)
        hidden = torch.cat(self._own_hidden_states(trajectories))
        bias = None if layer.bias is None else layer.bias.cpu()
        return PolicyStates(OutputLayer(layer.weight.cpu(), bias), hidden.cpu())

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
        taken. It uses an AdamW of its own, so the learner's optimiser stays fresh.
        """
        spec = self.spec
        micro_batches = [batch for _, batch in self._micro_batches(trajectories)]
        where = [self._own_states(batch) for batch in micro_batches]
        counts = [int(w.sum()) for w in where]
        if current.hidden.shape[0] != sum(counts):
            raise ValueError(
                f"π_cur was given at {current.hidden.shape[0]} states, the batch has {sum(counts)}"
            )
        pre = output_layer(self.model).detached_copy(self.compute_dtype)
        hidden_pre = self._own_hidden_states(trajectories)
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

        def measured_kl() -> float:  # mean per-state KL(π_θ ‖ π_cur)
            return mean_state_kl(
                lambda k: chunked_logprobs_and_kl(
                    response_hidden_states(self.model, micro_batches[k])[where[k]],
                    micro_batches[k].response_ids[where[k]],
                    output_layer(self.model),
                    spec.temperature,
                    reference_hidden=hidden_cur[k],
                    reference=cur,
                    chunk_tokens=spec.logit_chunk_tokens,
                )[1]
            )

        lam = projection_lambda(kl_at, target_fraction * delta0)
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        kl_before = kl = measured_kl()
        steps = 0
        while kl > delta0 and steps < max_steps:
            optimizer.zero_grad(set_to_none=True)
            for k, batch in enumerate(micro_batches):
                with self.autocast():
                    loss = (
                        chunked_distillation_kl(
                            output_layer(self.model),
                            response_hidden_states(self.model, batch)[where[k]],
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
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), spec.optimizer.grad_clip)
            optimizer.step()
            steps += 1
            kl = measured_kl()
        return DistillResult(lam, kl_before, kl, steps, kl <= delta0)

    # --- weights and state ---------------------------------------------------------------------

    def weights(self) -> dict[str, torch.Tensor]:
        """The current weights as CPU tensors in the save dtype, named as in the HF model (what
        rollout engines load)."""
        return {
            name: tensor.detach().to("cpu", self.save_dtype, copy=True)
            for name, tensor in self.model.state_dict().items()
        }

    def save_pretrained(self, directory: str) -> str:
        """An HF directory (weights in the save dtype + tokenizer) loadable by transformers and
        vLLM."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        weights, seen = self.weights(), set()
        for name, tensor in self.model.state_dict().items():  # tied weights are saved once
            if tensor.data_ptr() in seen:
                del weights[name]
            seen.add(tensor.data_ptr())
        self.model.save_pretrained(directory, state_dict=weights)
        config = copy.deepcopy(self.model.config)
        config.dtype = self.save_dtype  # save_pretrained wrote the master weights' float32
        config.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        return directory

    def state_dict(self) -> dict[str, Any]:
        """Everything resume needs: float32 master weights, optimiser, β_i, the value head and
        torch's RNG. The weights are the live tensors (torch.save copies them to the file)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "trust_region": self.region.state_dict(),
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "rng": torch.get_rng_state(),
        }

    @while_resident  # AdamW's state takes its parameters' dtype and device
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.region.load_state_dict(state["trust_region"])
        if self.value_head is not None:
            self.value_head.load_state_dict(state["value_head"])
        torch.set_rng_state(state["rng"])

    def save_state(self, path: str) -> str:
        """Write `state_dict()` to `path` atomically (a checkpoint's learner file); nothing of it
        is returned through the caller."""
        write_atomically(path, lambda handle: torch.save(self.state_dict(), handle))
        return path

    def load_state(self, path: str) -> None:
        """Load what `save_state` wrote."""
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))

    def reset(self) -> None:
        """Back to what the constructor made of `spec`: its weights, a fresh optimiser and β,
        the seed's RNG (a retry of stage 0). The old model is freed before the new one loads."""
        spec = self.spec
        self.__dict__.clear()
        self.__init__(spec)

    def ready(self) -> bool:
        return True


def _on_device(layer: OutputLayer, device: torch.device) -> OutputLayer:
    bias = None if layer.bias is None else layer.bias.to(device)
    return OutputLayer(layer.weight.to(device), bias)


LearnerActor = ray.remote(Learner)
