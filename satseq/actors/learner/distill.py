"""The Stage-0 projection of a swapped-in agent (`satseq.cluster.swap`): the incoming model π_pre
distilled towards π_λ ∝ π_pre^{1/(1+λ)} π_cur^{λ/(1+λ)} at the agent's response states."""

from __future__ import annotations

import torch

from satseq.actors.forward import response_hidden_states, response_positions
from satseq.actors.learner.policy import AgentPolicy
from satseq.actors.learner.results import DistillResult, PolicyStates
from satseq.actors.learner.snapshot import TrainingSnapshot
from satseq.actors.sharding import clip_grad_norm_
from satseq.actors.trajectory import PaddedBatch, Trajectory
from satseq.algo.lm_head import OutputLayer, chunked_logprobs_and_kl
from satseq.algo.masks import owner_mask
from satseq.algo.projection import (
    chunked_distillation_kl,
    chunked_mixture_kl,
    projection_lambda,
)

STEP_GROWTH = 1.25
"""After a step that lowered the KL, the next one is this much larger (a line search that keeps
probing for the largest step that still descends)."""


def own_states(policy: AgentPolicy, batch: PaddedBatch) -> torch.Tensor:
    """Bool [n, T]: the response states whose token the agent wrote."""
    own = owner_mask(batch.owner_ids, [policy.spec.agent_index], batch.response_mask)
    return response_positions(batch) & (own > 0)


@torch.no_grad()
def own_hidden_states(
    policy: AgentPolicy, batches: list[PaddedBatch]
) -> tuple[list[torch.Tensor], OutputLayer]:
    """Per micro-batch (on the device), the last hidden states at the agent's response states,
    [M_mb, H], and a frozen copy of the output layer."""
    hidden = []
    for batch in batches:
        with policy.autocast():
            states, layer = response_hidden_states(policy.trunk, batch)
        hidden.append(states[own_states(policy, batch)].to(policy.reference_dtype))
    return hidden, layer.detached_copy(policy.reference_dtype)


def policy_states(policy: AgentPolicy, trajectories: list[Trajectory]) -> PolicyStates:
    """This policy (π_cur of a swap) at the agent's response states of `trajectories`."""
    hidden, layer = own_hidden_states(policy, policy.device_batches(trajectories))
    bias = None if layer.bias is None else layer.bias.cpu()
    cpu_layer = OutputLayer(layer.weight.cpu(), bias, layer.float32_logits)
    return PolicyStates(cpu_layer, torch.cat(hidden).cpu())


class Projection:
    """The fixed parts of one projection: the batch's micro-batches and the agent's states in
    them, π_pre (the incoming weights before distilling) and π_cur at those states."""

    def __init__(self, policy: AgentPolicy, trajectories: list[Trajectory], current: PolicyStates):
        self.policy = policy
        self.batches = policy.device_batches(trajectories)
        self.where = [own_states(policy, batch) for batch in self.batches]
        counts = [int(w.sum()) for w in self.where]
        if current.hidden.shape[0] != sum(counts):
            raise ValueError(
                f"π_cur was given at {current.hidden.shape[0]} states, the batch has {sum(counts)}"
            )
        self.hidden_pre, self.pre = own_hidden_states(policy, self.batches)
        bias = None if current.layer.bias is None else current.layer.bias.to(policy.device)
        self.cur = OutputLayer(
            current.layer.weight.to(policy.device), bias, current.layer.float32_logits
        )
        self.hidden_cur = list(current.hidden.to(policy.device).split(counts))
        self.states = max(sum(counts), 1)

    def target_kl(self, lam: float) -> float:
        """The mean per-state KL(π_λ ‖ π_cur)."""
        spec = self.policy.spec
        return self._mean_kl(
            lambda k: chunked_mixture_kl(
                self.pre,
                self.hidden_pre[k],
                self.cur,
                self.hidden_cur[k],
                lam,
                spec.temperature,
                spec.logit_chunk_tokens,
            )
        )

    def _mean_kl(self, per_state_kl) -> float:
        """The mean over every state of per_state_kl(k), micro-batch k's per-state KL."""
        with torch.no_grad(), self.policy.autocast():
            return sum(float(per_state_kl(k).sum()) for k in range(len(self.batches))) / self.states

    @torch.no_grad()
    def measure(self, lam: float) -> tuple[float, float]:
        """Of the weights now, from one forward pass: the mean per-state KL(π_θ ‖ π_cur) (what
        the budget bounds) and the distillation loss (what the steps descend)."""
        kl = loss = 0.0
        for k in range(len(self.batches)):
            with self.policy.autocast():
                kl += float(self._state_kl(k).sum()) / self.states
                loss += float(self.distillation_loss(k, lam))
        return kl, loss

    def _policy_at(self, k: int) -> tuple[torch.Tensor, OutputLayer]:
        """π_θ at micro-batch k's states: hidden states [M_k, H] and the output layer."""
        hidden, layer = response_hidden_states(self.policy.trunk, self.batches[k])
        return hidden[self.where[k]], layer

    def _state_kl(self, k: int) -> torch.Tensor:
        """Per-state KL(π_θ ‖ π_cur) at micro-batch k's states, [M_k]."""
        spec = self.policy.spec
        hidden, layer = self._policy_at(k)
        return chunked_logprobs_and_kl(
            hidden,
            self.batches[k].response_ids[self.where[k]],
            layer,
            spec.temperature,
            reference_hidden=self.hidden_cur[k],
            reference=self.cur,
            chunk_tokens=spec.logit_chunk_tokens,
        )[1]

    def distillation_loss(self, k: int, lam: float) -> torch.Tensor:
        """Micro-batch k's share of the token-mean exact KL(π_λ ‖ π_θ)."""
        spec = self.policy.spec
        hidden, layer = self._policy_at(k)
        kl = chunked_distillation_kl(
            layer,
            hidden,
            self.pre,
            self.hidden_pre[k],
            self.cur,
            self.hidden_cur[k],
            lam,
            spec.temperature,
            spec.logit_chunk_tokens,
        )
        return kl.sum() / self.states


def distill(
    policy: AgentPolicy,
    trajectories: list[Trajectory],
    current: PolicyStates,
    delta0: float,
    max_steps: int,
    lr: float,
    target_fraction: float = 1.0,
) -> DistillResult:
    """The Stage-0 projection: this (incoming) model π_pre distilled towards the per-state
    target π_λ at the agent's response states of `trajectories`, λ bisected so that the mean
    KL(π_λ ‖ π_cur) ≤ target_fraction·δ0.

    The loss is the exact vocabulary KL(π_λ ‖ π_θ), token-mean, a chunk of states at a time;
    steps go on until the measured mean KL(π_θ ‖ π_cur) ≤ δ0 or `max_steps` are taken. The
    step size is searched: a step that raises the loss is undone and the next is half as large,
    one that lowers it is kept and the next is `STEP_GROWTH` times larger (`lr` is the first).
    It uses an AdamW of its own, so the learner's optimiser stays fresh. Sharded, every rank
    distils on the whole batch.
    """
    projection = Projection(policy, trajectories, current)
    lam = projection_lambda(projection.target_kl, target_fraction * delta0)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=lr, weight_decay=0.0)
    snapshot = TrainingSnapshot()
    kl, loss = projection.measure(lam)
    kl_before, steps = kl, 0
    while kl > delta0 and steps < max_steps:
        policy.reshard()  # sharded: the snapshot holds the shards
        snapshot.save(policy.model, optimizer)
        optimizer.zero_grad(set_to_none=True)
        for k in range(len(projection.batches)):
            with policy.autocast():
                projection.distillation_loss(k, lam).backward()
        clip_grad_norm_(policy.trainable_parameters(), policy.spec.optimizer.grad_clip)
        optimizer.step()
        steps += 1
        kl_after, loss_after = projection.measure(lam)
        overshot = loss_after > loss
        if overshot:  # back to the step's start, with half the step size
            policy.reshard()
            snapshot.restore(policy.model, optimizer)
        else:
            kl, loss = kl_after, loss_after
        for group in optimizer.param_groups:
            group["lr"] *= 0.5 if overshot else STEP_GROWTH
    return DistillResult(lam, kl_before, kl, steps, kl <= delta0)
