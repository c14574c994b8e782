"""One agent's update (DESIGN §3 step 6, §4), top to bottom: `run_update` makes `ppo_epochs`
passes over the agent's stage batch; each `trust_region_epoch` takes the epoch's optimiser steps,
one per shuffled mini-batch of `mini_batch_size` trajectories, then checks the KL quantile over
the whole batch, and on a violation restores the epoch's start, grows β and retries it; each
`optimizer_step` is one AdamW step on the loss, summed over its micro-batches.

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
from dataclasses import dataclass, field

import torch

from satseq.actors.forward import response_hidden_states, response_positions, scatter_response
from satseq.actors.learner.policy import AgentPolicy
from satseq.actors.learner.results import UpdateResult
from satseq.actors.residency import peak_memory_gib, reset_peak_memory
from satseq.actors.sharding import clip_grad_norm_
from satseq.actors.trajectory import PaddedBatch, Trajectory
from satseq.algo.kl import kl_k3, kl_quantile, sequence_kl
from satseq.algo.lm_head import OutputLayer, chunked_logprobs_and_kl
from satseq.algo.losses import kl_penalty, policy_loss
from satseq.algo.masks import owner_mask
from satseq.algo.trust_region import StepDecision, StepOutcome, TrustRegion

logger = logging.getLogger(__name__)


@dataclass
class MicroBatch:
    """One micro-batch: its rows of the batch, tensors on the learner's device, agent i's token
    mask [n, T_mb] and its share of its step's loss normaliser. A sharded rank's stand-in
    (real=False) has weight 0 and its results are dropped."""

    rows: list[int]
    batch: PaddedBatch
    mask: torch.Tensor
    weight: float
    real: bool = True


@dataclass
class StageReference:
    """What the exact KL needs of π_cur (the stage-start policy): its output layer, and its last
    hidden states at each trajectory's response states ([T_row, H] per row), taken while π_θ is
    still π_cur instead of from a second model."""

    layer: OutputLayer | None = None
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)

    def record(self, mb: MicroBatch, hidden: torch.Tensor, layer: OutputLayer, dtype) -> None:
        """π_cur at micro-batch `mb`'s response states (hidden [M, H], row-major)."""
        if self.layer is None:
            self.layer = layer.detached_copy(dtype)
        lengths = mb.batch.response_lengths.tolist()
        for row, states in zip(mb.rows, hidden.detach().split(lengths), strict=True):
            self.hidden.setdefault(row, states.to(dtype))

    def states(self, mb: MicroBatch) -> torch.Tensor:
        """π_cur's hidden states at `mb`'s response states, [M, H] row-major."""
        return torch.cat([self.hidden[row] for row in mb.rows])


@dataclass
class StepStats:
    """One optimiser step (or a whole epoch's steps, combined)."""

    loss: float = 0.0
    clip_fraction: float = 0.0
    kl_penalty: float = 0.0
    ratio_max: float = 0.0
    steps: int = 0
    skipped: int = 0  # steps not taken: their gradient was not finite

    @staticmethod
    def mean(parts: list[StepStats]) -> StepStats:
        n = max(len(parts), 1)
        return StepStats(
            loss=sum(p.loss for p in parts) / n,
            clip_fraction=sum(p.clip_fraction for p in parts) / n,
            kl_penalty=sum(p.kl_penalty for p in parts) / n,
            ratio_max=max((p.ratio_max for p in parts), default=0.0),
            steps=sum(p.steps for p in parts),
            skipped=sum(p.skipped for p in parts),
        )


@dataclass(frozen=True)
class Attempt:
    """One attempt at an epoch: its steps' statistics and the KL check after them."""

    stats: StepStats
    kl_quantile: float
    logp_new: torch.Tensor | None  # [N, T] under the weights after the epoch, where measured


@dataclass
class UpdateContext:
    """What every level of one update reads: the policy, the agent's whole batch as fixed
    micro-batches (the KL check and logp_hat run over them), the behaviour log-probs logp_cur
    [N, T], the advantages A and IS weights c [N], and π_cur's reference for the exact KL (None
    with k3). record_behaviour: the first step's forward pass writes logp_cur and the reference
    (the update is one step per epoch; otherwise `reference_pass` filled them first)."""

    policy: AgentPolicy
    trajectories: list[Trajectory]
    whole_batch: list[MicroBatch]
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
) -> UpdateResult:
    """`ppo_epochs` trust-region epochs on the agent's tokens of `trajectories`.

    logp_cur [N, T]: behaviour log-probs (stage-start weights, sampling temperature); None
    when the behaviour policy is this learner's weights as they are now: they are then taken
    from a forward pass of those weights (the first step's, when an epoch is one step).
    A, c [N]: advantages and truncated IS weights per trajectory.
    """
    started = time.perf_counter()
    reset_peak_memory(policy.device)
    spec = policy.spec
    whole_batch, tokens = agent_micro_batches(policy, trajectories)
    record_behaviour = logp_cur is None
    if record_behaviour:
        T = max((len(t.response_ids) for t in trajectories), default=1)
        logp_cur = torch.zeros(len(trajectories), max(T, 1), device="cpu")
    reference = StageReference() if spec.trust_region.kl_estimator == "exact" else None
    ctx = UpdateContext(
        policy, trajectories, whole_batch, logp_cur, A, c, reference, record_behaviour
    )
    rows = agent_rows(policy, trajectories)
    one_step_epochs = spec.mini_batch_size is None or spec.mini_batch_size >= len(rows)
    if whole_batch and not one_step_epochs:
        reference_pass(ctx)
    logp_hat = None  # the agent's tokens under the weights of the last applied epoch
    epochs: list[StepOutcome] = []
    attempts: list[Attempt] = []
    for epoch in range(spec.ppo_epochs if whole_batch else 0):
        steps = (
            [whole_batch]
            if one_step_epochs
            else [
                agent_micro_batches(policy, trajectories, mini_batch)[0]
                for mini_batch in mini_batch_rows(policy, rows)
            ]
        )
        outcome, epoch_attempts = trust_region_epoch(ctx, region, epoch, steps)
        epochs.append(outcome)
        attempts += epoch_attempts
        if outcome.applied:
            logp_hat = epoch_attempts[-1].logp_new
    if logp_hat is None and spec.trust_region.measure:  # every epoch rejected
        logp_hat = ctx.logp_cur.clone()
    last = attempts[-1].stats if attempts else StepStats()
    return UpdateResult(
        logp_hat=logp_hat,
        steps=epochs,
        loss=last.loss,
        clip_fraction=last.clip_fraction,
        tokens=tokens,
        seconds=time.perf_counter() - started,
        peak_memory_gib=peak_memory_gib(policy.device),
        kl_penalty=last.kl_penalty,
        ratio_max=last.ratio_max,
        optimizer_steps=sum(attempt.stats.steps for attempt in _kept(attempts, epochs)),
        skipped_steps=sum(attempt.stats.skipped for attempt in attempts),
    )


def trust_region_epoch(
    ctx: UpdateContext, region: TrustRegion, epoch: int, steps: list[list[MicroBatch]]
) -> tuple[StepOutcome, list[Attempt]]:
    """One epoch: an optimiser step per mini-batch (`steps`: each one's micro-batches), then
    the KL check over the whole batch. With the trust region: attempts until q ≤ target_kl,
    each failure restoring the weights and optimiser state of the epoch's start and growing β
    (DESIGN §4); without: one attempt, always kept (q is still measured unless `measure` is
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
        q, logp_new = (
            kl_quantile_and_logprobs(ctx) if spec.trust_region.measure else (float("nan"), None)
        )
        attempts.append(Attempt(stats, q, logp_new))
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
    """One AdamW step on the loss of DESIGN §4 over a mini-batch's micro-batches, with KL
    penalty β and the learning rate scaled by step_scale. first: the update's first step,
    taken at π_cur, where KL(π_θ ‖ π_cur) and its gradient are exactly 0 (a backtrack restores
    that point), so it pays no penalty; its forward pass records π_cur's reference and, with
    record_behaviour, the behaviour log-probs logp_cur before the loss reads them."""
    policy, spec = ctx.policy, ctx.policy.spec
    for group in policy.optimizer.param_groups:
        group["lr"] = spec.optimizer.lr * step_scale
    policy.optimizer.zero_grad(set_to_none=True)
    penalise = beta > 0 and not first
    record_behaviour = first and ctx.record_behaviour
    loss_sum = torch.zeros((), device=policy.device)
    clip_sum = penalty_sum = 0.0
    ratio_max = 0.0
    recorded = []
    logp_cur = ctx.logp_cur
    for mb in micro_batches:
        with policy.autocast():
            logp, per_token_kl = logprobs_and_kl(ctx, mb, record_reference=first, with_kl=penalise)
        if record_behaviour:
            logp_cur[mb.rows, : logp.shape[1]] = (logp.detach() * mb.mask).float().cpu()
            if mb.real:
                recorded.append((mb.rows, logp_cur[mb.rows, : logp.shape[1]]))
        pl = policy_loss(
            logp,
            logp_cur[mb.rows, : mb.mask.shape[1]].to(policy.device),
            ctx.A[mb.rows].to(policy.device),
            mb.mask,
            c=ctx.c[mb.rows].to(policy.device),
            ratio=spec.loss.ratio,
            eps_low=spec.loss.eps_low,
            eps_high=spec.loss.eps_high,
            dual_clip=spec.loss.dual_clip,
            aggregation=spec.loss.aggregation,
        )
        loss = pl.loss
        if penalise:
            penalty = kl_penalty(per_token_kl, mb.mask, beta)
            loss = loss + penalty
            penalty_sum += float(penalty.detach()) * mb.weight
        (loss * (mb.weight * policy.group.world)).backward()  # FSDP2 averages over ranks
        loss_sum += loss.detach() * mb.weight
        clip_sum += pl.clip_fraction * mb.weight
        ratio_max = max(ratio_max, pl.ratio_max if mb.real else 0.0)
    for rows_of, values in (part for parts in policy.group.gather(recorded) for part in parts):
        logp_cur[rows_of, : values.shape[1]] = values  # sharded: the other ranks' rows too
    grad_norm = clip_grad_norm_(policy.trainable_parameters(), spec.optimizer.grad_clip)
    finite = math.isfinite(grad_norm)  # the whole gradient's norm: every rank agrees
    if finite:
        policy.optimizer.step()
    else:  # a NaN or infinite gradient would make every weight NaN: skip the step
        logger.warning(
            "agent %d: gradient norm %s, the optimiser step is skipped", spec.agent_index, grad_norm
        )
    group = policy.group
    return StepStats(
        loss=group.sum(float(loss_sum)),
        clip_fraction=group.sum(clip_sum),
        kl_penalty=group.sum(penalty_sum),
        ratio_max=max(group.gather(ratio_max)),
        steps=1 if finite else 0,
        skipped=0 if finite else 1,
    )


def logprobs_and_kl(
    ctx: UpdateContext, mb: MicroBatch, record_reference: bool = False, with_kl: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π_θ of the micro-batch's response tokens [n, T_mb] and, if with_kl, the per-token
    KL(π_θ ‖ π_cur) [n, T_mb]: exact over the vocabulary, or k3 on the sampled tokens.
    record_reference: θ is π_cur; keep its states for the exact KL of later steps."""
    policy, reference = ctx.policy, ctx.reference
    where = response_positions(mb.batch)
    hidden, layer = response_hidden_states(policy.trunk, mb.batch)
    hidden = hidden[where]
    if reference is not None and record_reference:
        reference.record(mb, hidden, layer, policy.reference_dtype)
    exact = with_kl and reference is not None
    logp, kl = chunked_logprobs_and_kl(
        hidden,
        mb.batch.response_ids[where],
        layer,
        policy.spec.temperature,
        reference_hidden=reference.states(mb) if exact else None,
        reference=reference.layer if exact else None,
        chunk_tokens=policy.spec.logit_chunk_tokens,
    )
    logp = scatter_response(logp, where)
    if not with_kl:
        return logp, None
    if exact:
        return logp, scatter_response(kl, where)
    return logp, kl_k3(logp, ctx.logp_cur[mb.rows, : logp.shape[1]].to(logp.device))


@torch.no_grad()
def reference_pass(ctx: UpdateContext) -> None:
    """Before an update of several steps per epoch: π_cur's reference states (exact KL) and,
    with record_behaviour, the behaviour log-probs logp_cur, from one forward pass over the
    whole batch while θ is still π_cur (later steps' forward passes run other weights)."""
    policy = ctx.policy
    recorded = []
    for mb in ctx.whole_batch:
        with policy.autocast():
            logp, _ = logprobs_and_kl(ctx, mb, record_reference=True, with_kl=False)
        if ctx.record_behaviour and mb.real:
            recorded.append((mb.rows, (logp * mb.mask).float().cpu()))
    for rows, values in (part for parts in policy.group.gather(recorded) for part in parts):
        ctx.logp_cur[rows, : values.shape[1]] = values
    if ctx.reference is not None and policy.group.sharded:  # every rank needs every row's
        for part in policy.group.gather({r: h.cpu() for r, h in ctx.reference.hidden.items()}):
            for row, states in part.items():
                ctx.reference.hidden.setdefault(row, states.to(policy.device))
    ctx.record_behaviour = False


@torch.no_grad()
def kl_quantile_and_logprobs(ctx: UpdateContext) -> tuple[float, torch.Tensor]:
    """After an epoch: q over the agent's sequences of the whole batch (of every rank), with
    the DKW slack `kl_ctrl.dkw_eta`, and the new log-probs [N, T] (rows without agent i's
    tokens keep logp_cur)."""
    policy = ctx.policy
    computed = []
    for mb in ctx.whole_batch:
        with policy.autocast():
            logp, per_token_kl = logprobs_and_kl(ctx, mb)
        if mb.real:
            owns = mb.mask.sum(-1) > 0
            seq_kl = sequence_kl(per_token_kl, mb.mask)[owns]
            computed.append((mb.rows, logp.cpu(), seq_kl.float().cpu()))
    logp_new = ctx.logp_cur.clone()
    seq_kls = []
    for rows, logp, seq_kl in (part for parts in policy.group.gather(computed) for part in parts):
        logp_new[rows, : logp.shape[1]] = logp
        seq_kls.append(seq_kl)
    tr = policy.spec.trust_region
    return kl_quantile(torch.cat(seq_kls), tr.alpha, tr.dkw_eta), logp_new


def agent_micro_batches(
    policy: AgentPolicy, trajectories: list[Trajectory], rows: list[int] | None = None
) -> tuple[list[MicroBatch], int]:
    """This rank's micro-batches of `rows` (default: every trajectory, in order) that hold
    agent i's tokens (sharded: its share, with stand-ins), each weighted by its share of the
    loss's normaliser (tokens or sequences) over all of them; and the agent's token count."""
    spec = policy.spec
    micro_batches = []
    for mb_rows, batch in policy.micro_batches(trajectories, rows):
        mask = owner_mask(batch.owner_ids, [spec.agent_index], batch.response_mask)
        count = mask.sum() if spec.loss.aggregation == "token_mean" else (mask.sum(-1) > 0).sum()
        if count > 0:
            micro_batches.append(MicroBatch(mb_rows, batch, mask, float(count)))
    total = sum(mb.weight for mb in micro_batches)
    tokens = int(sum(float(mb.mask.sum()) for mb in micro_batches))
    mine = []
    for mb, real in policy.group.mine(micro_batches):
        weight = mb.weight / total if real else 0.0
        mine.append(
            MicroBatch(mb.rows, mb.batch.to(policy.device), mb.mask.to(policy.device), weight, real)
        )
    return mine, tokens


def agent_rows(policy: AgentPolicy, trajectories: list[Trajectory]) -> list[int]:
    """The rows whose trajectory holds a token agent i wrote (and is trained on)."""
    i = policy.spec.agent_index
    return [
        row
        for row, t in enumerate(trajectories)
        if any(o == i and m for o, m in zip(t.owner_ids, t.response_mask, strict=True))
    ]


def mini_batch_rows(policy: AgentPolicy, rows: list[int]) -> list[list[int]]:
    """`rows` shuffled into mini-batches of `mini_batch_size` trajectories, with a seed every
    rank shares (drawn from rank 0's torch RNG, which resume restores)."""
    seed = policy.group.gather(int(torch.randint(2**62, ())))[0]
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    size = policy.spec.mini_batch_size
    return [[rows[i] for i in order[start : start + size]] for start in range(0, len(rows), size)]


def _kept(attempts: list[Attempt], epochs: list[StepOutcome]) -> list[Attempt]:
    """Each applied epoch's last attempt (the one whose weights were kept)."""
    kept, index = [], 0
    for outcome in epochs:
        index += len(outcome.kl_quantiles)
        if outcome.applied:
            kept.append(attempts[index - 1])
    return kept
