"""One agent's update (design §3 step 6, §4), top to bottom: `run_update` makes `ppo_epochs`
passes over the agent's stage batch; each `trust_region_epoch` takes the epoch's optimiser steps,
one per shuffled mini-batch of `mini_batch_size` trajectories, then checks the KL quantile over
the whole batch (or the held-out rows), and on a violation restores the epoch's start, grows β
and retries it; each `optimizer_step` is one AdamW step on the loss, summed over its
micro-batches (the batch bookkeeping is `micro_batches.py`).

logp_cur (the proximal policy of the loss) stays fixed for the whole update, so the ratio r
departs from 1 after the first step and the clip and β act. Memory: the exact KL's π_cur is the
stage-start output layer plus the stage-start hidden states at the batch's response states (per
trajectory), not a copy of the model. Sharded, each rank computes its share of every step's
micro-batches (stand-ins of weight 0 keep the collectives in step).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from satseq.actors.forward import response_hidden_states, response_positions, scatter_response
from satseq.actors.host_reads import read_back, read_back_rows
from satseq.actors.learner.micro_batches import (
    MicroBatch,
    StageReference,
    agent_micro_batches,
    agent_rows,
    every_rank,
    fill_rows,
    mini_batch_count,
    mini_batch_rows,
    padding_fraction,
)
from satseq.actors.learner.policy import AgentPolicy
from satseq.actors.learner.results import UpdateResult
from satseq.actors.learner.step_stats import Attempt, StepStats, kept_attempts
from satseq.actors.residency import peak_memory_gib, reset_peak_memory
from satseq.actors.sharding import clip_grad_norm_
from satseq.actors.trajectory import Trajectory
from satseq.algo.kl import kl_k3, kl_quantile, sequence_kl
from satseq.algo.lm_head import chunked_logprobs_and_kl
from satseq.algo.losses import PolicyLoss, kl_penalty, policy_loss
from satseq.algo.trust_region import StepDecision, StepOutcome, TrustRegion

logger = logging.getLogger(__name__)


@dataclass
class UpdateContext:
    """What every level of one update reads: the policy, the agent's whole training batch as
    fixed micro-batches, the rows the KL check measures (`checked`: the training batch, or the
    held-out rows), the behaviour log-probs logp_cur [N, T], the advantages A [N] and weights c
    ([N], or [N, T] per token), and π_cur's reference for the exact KL (None with k3).
    record_behaviour: the first step's forward pass writes logp_cur and the reference (the
    update is one step per epoch; otherwise `reference_pass` filled them first)."""

    policy: AgentPolicy
    trajectories: list[Trajectory]
    whole_batch: list[MicroBatch]
    checked: list[MicroBatch]
    logp_cur: torch.Tensor
    A: torch.Tensor
    c: torch.Tensor
    reference: StageReference | None
    record_behaviour: bool


def run_update(
    policy: AgentPolicy,
    region: TrustRegion,
    trajectories: list[Trajectory],
    logp_cur: torch.Tensor | None,
    A: torch.Tensor,
    c: torch.Tensor,
    held_out: int = 0,
) -> UpdateResult:
    """`ppo_epochs` trust-region epochs on the agent's tokens of `trajectories`.

    logp_cur [N, T]: behaviour log-probs (stage-start weights, sampling temperature); None
    when the behaviour policy is this learner's weights as they are now: they are then taken
    from a forward pass of those weights (the first step's, when an epoch is one step).
    A [N]: advantages; c [N] or [N, T]: the weights of each trajectory (SAT-Seq's IS weights, a
    sequence-level rollout correction) or token (a token-level one).
    held_out: the last `held_out` trajectories are never trained on, and the KL check measures
    them instead of the training rows (`kl_ctrl.measure_on: held_out`); 0: the training rows.
    """
    started = time.perf_counter()
    reset_peak_memory(policy.device)
    spec = policy.spec
    ctx, tokens = update_context(policy, trajectories, logp_cur, A, c, held_out)
    rows = agent_rows(policy, trajectories[: len(trajectories) - held_out])
    one_step_epochs = mini_batch_count(len(rows), spec.mini_batch_size) == 1
    if ctx.whole_batch and (ctx.reference is not None or ctx.record_behaviour):
        # π_cur's states and logp_cur before θ moves: of the held-out rows, and of the
        # training rows unless the first step's forward pass records them
        if held_out:
            reference_pass(ctx, ctx.checked)
        if not one_step_epochs:
            reference_pass(ctx, ctx.whole_batch)
            ctx.record_behaviour = False
    epochs: list[StepOutcome] = []
    attempts: list[Attempt] = []
    for epoch in range(spec.ppo_epochs if ctx.whole_batch else 0):
        steps = (
            [ctx.whole_batch]
            if one_step_epochs
            else [
                agent_micro_batches(policy, trajectories, mini_batch)[0]
                for mini_batch in mini_batch_rows(policy, rows)
            ]
        )
        outcome, epoch_attempts = trust_region_epoch(ctx, region, epoch, steps)
        epochs.append(outcome)
        attempts += epoch_attempts
    logp_hat, sequence_kl = final_measurements(ctx, epochs, attempts)
    last = attempts[-1].stats if attempts else StepStats()
    return UpdateResult(
        logp_hat=logp_hat,
        sequence_kl=sequence_kl,
        steps=epochs,
        loss=last.loss,
        clip_fraction=last.clip_fraction,
        tokens=tokens,
        seconds=time.perf_counter() - started,
        peak_memory_gib=peak_memory_gib(policy.device),
        kl_penalty=last.kl_penalty,
        ratio_max=last.ratio_max,
        optimizer_steps=sum(attempt.stats.steps for attempt in kept_attempts(attempts, epochs)),
        skipped_steps=sum(attempt.stats.skipped for attempt in attempts),
        padding_fraction=padding_fraction(ctx.whole_batch),
    )


def update_context(
    policy: AgentPolicy,
    trajectories: list[Trajectory],
    logp_cur: torch.Tensor | None,
    A: torch.Tensor,
    c: torch.Tensor,
    held_out: int,
) -> tuple[UpdateContext, int]:
    """The update's context (`run_update`'s arguments as micro-batches; logp_cur zeros to be
    recorded where None) and the agent's training token count."""
    n_train = len(trajectories) - held_out
    whole_batch, tokens = agent_micro_batches(policy, trajectories, list(range(n_train)))
    checked = whole_batch
    if held_out:
        checked = agent_micro_batches(
            policy, trajectories, list(range(n_train, n_train + held_out))
        )[0]
    record_behaviour = logp_cur is None
    if record_behaviour:
        T = max((len(t.response_ids) for t in trajectories), default=1)
        logp_cur = torch.zeros(len(trajectories), max(T, 1), device="cpu")
    exact = policy.spec.trust_region.kl_estimator == "exact"
    reference = StageReference() if exact else None
    return UpdateContext(
        policy, trajectories, whole_batch, checked, logp_cur, A, c, reference, record_behaviour
    ), tokens


def final_measurements(
    ctx: UpdateContext, epochs: list[StepOutcome], attempts: list[Attempt]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """logp_hat [N, T] and each checked row's sequence KL [N] under the weights the update
    leaves: the last applied epoch's, or π_cur's (KL 0) where every epoch was rejected; None
    where the epochs were not measured."""
    if not ctx.policy.spec.trust_region.measure:
        return None, None
    if not attempts:
        return ctx.logp_cur.clone(), None
    kept = kept_attempts(attempts, epochs)
    if not kept:
        measured = attempts[-1].sequence_kl
        return ctx.logp_cur.clone(), torch.where(measured.isnan(), measured, 0.0)
    logp_hat = kept[-1].logp_new
    if ctx.checked is not ctx.whole_batch:  # the check measured the held-out rows only
        logp_hat = training_logprobs(ctx, logp_hat)
    return logp_hat, kept[-1].sequence_kl


def trust_region_epoch(
    ctx: UpdateContext, region: TrustRegion, epoch: int, steps: list[list[MicroBatch]]
) -> tuple[StepOutcome, list[Attempt]]:
    """One epoch: an optimiser step per mini-batch (`steps`: each one's micro-batches), then
    the KL check over the whole batch. With the trust region: attempts until q ≤ target_kl,
    each failure restoring the weights and optimiser state of the epoch's start and growing β
    (design §4); without: one attempt, always kept (q is still measured unless `measure` is
    off)."""
    policy, spec = ctx.policy, ctx.policy.spec
    enabled = spec.trust_region.enabled
    plan = region.attempts(policy.save_snapshot, policy.restore) if enabled else [(0.0, 1.0)]
    attempts: list[Attempt] = []
    for beta, step_scale in plan:
        stats = StepStats.mean(
            [
                optimizer_step(ctx, micro_batches, beta, step_scale, first=epoch == 0 and k == 0)
                for k, micro_batches in enumerate(steps)
            ]
        )
        q, logp_new, sequence_kl = (
            kl_check(ctx) if spec.trust_region.measure else (float("nan"), None, None)
        )
        attempts.append(Attempt(stats, q, logp_new, sequence_kl))
        if spec.trust_region.measure and not math.isfinite(q):
            logger.warning(
                "agent %d, epoch %d: the KL quantile after its steps is %s (the weights are not "
                "finite)%s",
                spec.agent_index,
                epoch,
                q,
                ": the epoch is restored" if enabled else "",
            )
        if enabled:
            region.judge(q)
    if not enabled:
        return StepOutcome(StepDecision.ACCEPT, 0, [attempts[0].kl_quantile], 0.0), attempts
    return region.outcome, attempts


def optimizer_step(
    ctx: UpdateContext,
    micro_batches: list[MicroBatch],
    beta: float,
    step_scale: float,
    first: bool,
) -> StepStats:
    """One AdamW step on the loss of design §4 over a mini-batch's micro-batches, with KL
    penalty β and the learning rate scaled by step_scale. first: the update's first step,
    taken at π_cur, where KL(π_θ ‖ π_cur) and its gradient are exactly 0 (a backtrack restores
    that point), so it pays no penalty; its forward pass records π_cur's reference and, with
    record_behaviour, the behaviour log-probs logp_cur before the loss reads them. The step's
    statistics stay on the device until one read at its end (`read_back`)."""
    policy, spec = ctx.policy, ctx.policy.spec
    for group in policy.optimizer.param_groups:
        group["lr"] = spec.optimizer.lr * step_scale
    policy.optimizer.zero_grad(set_to_none=True)
    penalise = beta > 0 and not first
    record_behaviour = first and ctx.record_behaviour
    weighted = torch.zeros(3, device=policy.device)  # Σ weight · (loss, clip fraction, penalty)
    ratio_max = torch.zeros((), device=policy.device)
    recorded = []  # (rows, behaviour log-probs on the device)
    with policy.cast_once():  # the weights change only at the step below
        for mb in micro_batches:
            with policy.autocast():
                logp, per_token_kl = logprobs_and_kl(
                    ctx, mb, record_reference=first, with_kl=penalise
                )
            behaviour = (logp.detach() * mb.mask).float() if record_behaviour else None
            if behaviour is not None and mb.real:
                recorded.append((mb.rows, behaviour))
            pl = surrogate(ctx, mb, logp, behaviour)
            loss, penalty = pl.loss, torch.zeros((), device=policy.device)
            if penalise:
                penalty = kl_penalty(per_token_kl, mb.mask, beta, spec.loss.aggregation)
                loss = loss + penalty
            (loss * (mb.weight * policy.group.world)).backward()  # FSDP2 averages over ranks
            terms = torch.stack([loss.detach(), pl.clip_fraction, penalty.detach()])
            weighted += terms.float() * mb.weight
            if mb.real:
                ratio_max = torch.maximum(ratio_max, pl.ratio_max.float())
    grad_norm = clip_grad_norm_(policy.trainable_parameters(), spec.optimizer.grad_clip)
    host = read_back([weighted, ratio_max, grad_norm, *(values for _, values in recorded)])
    (loss_sum, clip_sum, penalty_sum), ratio_max, grad_norm = host[0].tolist(), *host[1:3]
    recorded = [(rows, values) for (rows, _), values in zip(recorded, host[3:], strict=True)]
    fill_rows(ctx.logp_cur, every_rank(policy, recorded))
    finite = math.isfinite(float(grad_norm))  # the whole gradient's norm: every rank agrees
    if finite:
        policy.optimizer.step()
    else:  # a NaN or infinite gradient would make every weight NaN: skip the step
        logger.warning(
            "agent %d: gradient norm %s, the optimiser step is skipped",
            spec.agent_index,
            float(grad_norm),
        )
    policy.optimizer.zero_grad(set_to_none=True)  # freed now, not kept through the KL check
    group = policy.group
    return StepStats(
        loss=group.sum(loss_sum),
        clip_fraction=group.sum(clip_sum),
        kl_penalty=group.sum(penalty_sum),
        ratio_max=max(group.gather(float(ratio_max))),
        steps=1 if finite else 0,
        skipped=0 if finite else 1,
    )


def surrogate(
    ctx: UpdateContext, mb: MicroBatch, logp: torch.Tensor, behaviour: torch.Tensor | None
) -> PolicyLoss:
    """The policy term of design §4 on micro-batch `mb` (log π_θ [n, T_mb]), against its rows'
    logp_cur (`behaviour` on the device where this step's forward pass records it), advantages
    A and weights c (per trajectory, or per token)."""
    loss, device = ctx.policy.spec.loss, ctx.policy.device
    T_mb = mb.mask.shape[1]
    c = ctx.c[mb.rows] if ctx.c.dim() == 1 else ctx.c[mb.rows, :T_mb]
    if behaviour is None:
        behaviour = ctx.logp_cur[mb.rows, :T_mb].to(device)
    return policy_loss(
        logp,
        behaviour,
        ctx.A[mb.rows].to(device),
        mb.mask,
        c=c.to(device),
        ratio=loss.ratio,
        eps_low=loss.eps_low,
        eps_high=loss.eps_high,
        dual_clip=loss.dual_clip,
        aggregation=loss.aggregation,
    )


def logprobs_and_kl(
    ctx: UpdateContext, mb: MicroBatch, record_reference: bool = False, with_kl: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π_θ of the micro-batch's response tokens [n, T_mb] and, if with_kl, the per-token
    KL(π_θ ‖ π_cur) [n, T_mb]: exact over the vocabulary, or k3 on the sampled tokens.
    record_reference: θ is π_cur; keep its states for the exact KL of later steps."""
    policy, reference = ctx.policy, ctx.reference
    where, index = response_positions(mb.batch), mb.token_index
    hidden, layer = response_hidden_states(policy.trunk, mb.batch, mb.packed)
    hidden = hidden.flatten(0, 1)[index]
    if reference is not None and record_reference:
        reference.record(mb, hidden, layer, policy.reference_dtype)
    exact = with_kl and reference is not None
    logp, kl = chunked_logprobs_and_kl(
        hidden,
        mb.batch.response_ids.flatten()[index],
        layer,
        policy.spec.temperature,
        reference_hidden=reference.states(mb) if exact else None,
        reference=reference.layer if exact else None,
        chunk_tokens=policy.spec.logit_chunk_tokens,
    )
    logp = scatter_response(logp, where, index)
    if not with_kl:
        return logp, None
    if exact:
        return logp, scatter_response(kl, where, index)
    return logp, kl_k3(logp, ctx.logp_cur[mb.rows, : logp.shape[1]].to(logp.device))


@torch.no_grad()
def reference_pass(ctx: UpdateContext, micro_batches: list[MicroBatch]) -> None:
    """π_cur's reference states (exact KL) and, with record_behaviour, the behaviour log-probs
    logp_cur of `micro_batches`, from a forward pass while θ is still π_cur (before an update
    of several steps per epoch, whose later forward passes run other weights; and of the
    held-out rows the check measures)."""
    policy = ctx.policy
    computed = [
        (mb.rows, logp * mb.mask)
        for mb, logp, _ in forward_each(ctx, micro_batches, record_reference=True, with_kl=False)
        if ctx.record_behaviour
    ]
    fill_rows(ctx.logp_cur, every_rank(policy, read_back_rows(computed)))
    if ctx.reference is not None and policy.group.sharded:  # every rank needs every row's
        for part in policy.group.gather({r: h.cpu() for r, h in ctx.reference.hidden.items()}):
            for row, states in part.items():
                ctx.reference.hidden.setdefault(row, states.to(policy.device))


@torch.no_grad()
def kl_check(ctx: UpdateContext) -> tuple[float, torch.Tensor, torch.Tensor]:
    """After an epoch: q, the (1 − α) quantile of the per-sequence KLs over the checked rows
    (of every rank); the new log-probs [N, T] of those rows (the others keep logp_cur); and
    each row's sequence KL [N] (NaN for rows not checked, +inf where it is not finite)."""
    policy = ctx.policy
    real = [mb for mb in ctx.checked if mb.real]
    device_values = []  # each real micro-batch's log-probs [n, T_mb] and sequence KLs [n]
    for mb, logp, per_token_kl in forward_each(ctx, ctx.checked):
        device_values += [logp, sequence_kl(per_token_kl, mb.mask)]
    host = read_back(device_values)
    computed = []
    for mb, logp, seq_kl in zip(real, host[0::2], host[1::2], strict=True):
        owned = [k for k, own in enumerate(mb.owns) if own]
        computed.append((mb.rows, logp, [mb.rows[k] for k in owned], seq_kl[owned]))
    logp_new = ctx.logp_cur.clone()
    kls = torch.full((len(ctx.trajectories),), math.nan, device="cpu")
    measured = []
    for rows, logp, owning, seq_kl in every_rank(policy, computed):
        logp_new[rows, : logp.shape[1]] = logp
        kls[owning] = seq_kl.nan_to_num(math.inf, math.inf, math.inf)
        measured.append(seq_kl)
    measured = torch.cat(measured) if measured else torch.zeros(1, device="cpu")  # none measured
    return kl_quantile(measured, policy.spec.trust_region.alpha), logp_new, kls  # NaN: a violation


@torch.no_grad()
def training_logprobs(ctx: UpdateContext, logp_new: torch.Tensor) -> torch.Tensor:
    """`logp_new` [N, T] with the training rows' log-probs under the current weights filled in
    (the check measured the held-out rows only)."""
    computed = [
        (mb.rows, logp) for mb, logp, _ in forward_each(ctx, ctx.whole_batch, with_kl=False)
    ]
    fill_rows(logp_new, every_rank(ctx.policy, read_back_rows(computed)))
    return logp_new


def forward_each(
    ctx: UpdateContext, micro_batches: list[MicroBatch], **options: bool
) -> Iterator[tuple[MicroBatch, torch.Tensor, torch.Tensor | None]]:
    """`logprobs_and_kl(ctx, mb, **options)` of each micro-batch, the weights cast once for all
    of them; only the real ones' (a sharded rank's stand-ins are computed, for the collectives,
    and dropped)."""
    policy = ctx.policy
    with policy.cast_once():
        for mb in micro_batches:
            with policy.autocast():
                logp, kl = logprobs_and_kl(ctx, mb, **options)
            if mb.real:
                yield mb, logp, kl
