"""LearnerActor: one per agent. Holds the agent's model, AdamW and β_i, and runs its
trust-region update (DESIGN §3 step 6); in `gae` mode also the agent's value head. All math
comes from `satseq.algo`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import ray
import torch

from satseq.actors.forward import response_hidden_states, response_logits, response_logprobs
from satseq.actors.trajectory import PaddedBatch, Trajectory, pad_batch
from satseq.actors.value_head import ValueHead
from satseq.algo.kl import kl_exact_from_logprobs, kl_k3, kl_quantile, sequence_kl
from satseq.algo.logprobs import gather_token_logprobs, vocabulary_logprobs
from satseq.algo.losses import Aggregation, RatioMode, kl_penalty, policy_loss
from satseq.algo.masks import owner_mask
from satseq.algo.trust_region import (
    StepDecision,
    StepOutcome,
    TrustRegion,
    restore_training_state,
    snapshot_training_state,
    trust_region_step,
)
from satseq.models import load_policy


@dataclass(frozen=True)
class LossSpec:
    """Which policy loss the learner minimises (SAT-Seq defaults; SPO/GRPO set their own)."""

    ratio: RatioMode = "seq"
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    aggregation: Aggregation = "seq_mean"
    kl_estimator: Literal["exact", "k3"] = "exact"


@dataclass(frozen=True)
class LearnerSpec:
    model_path: str
    agent_index: int
    loss: LossSpec = field(default_factory=LossSpec)
    dtype: str = "float32"
    device: str = "cpu"
    lr: float = 1e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch_size: int = 8
    update_steps: int = 1
    gradient_checkpointing: bool = False
    temperature: float = 1.0
    kl_coef: float = 0.01
    target_kl: float = 0.05
    alpha: float = 0.1  # the KL quantile is the (1 − α) quantile
    beta_growth: float = 1.5
    step_shrink: float = 0.5
    max_backtracks: int = 3
    on_exhausted: Literal["reject", "keep"] = "reject"
    trust_region: bool = True  # False: plain PPO steps, no KL penalty, no backtracking (SPO, GRPO)
    value_lr: float | None = None  # `gae` mode: a value head fitted at this lr; None: no head
    value_steps: int = 8  # value-head steps per stage (sat_seq.value_steps)
    seed: int = 0
    num_threads: int = 1


@dataclass(frozen=True)
class UpdateResult:
    """What one agent's update did. logp_hat [N, T]: log-probs of the batch under the weights
    the agent holds afterwards (the stage-start ones where every step was rejected)."""

    logp_hat: torch.Tensor
    steps: list[StepOutcome]
    loss: float
    clip_fraction: float
    tokens: int
    seconds: float

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


class Learner:
    """One agent's model and optimiser. Plain class; `LearnerActor` is its Ray actor."""

    def __init__(self, spec: LearnerSpec):
        self.spec = spec
        torch.set_num_threads(spec.num_threads)
        torch.manual_seed(spec.seed)
        self.model, self.tokenizer = load_policy(
            spec.model_path, dtype=spec.dtype, device=spec.device
        )
        if spec.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay
        )
        self.region = TrustRegion(
            target_kl=spec.target_kl,
            alpha=spec.alpha,
            max_backtracks=spec.max_backtracks,
            beta=spec.kl_coef,
            beta_growth=spec.beta_growth,
            step_shrink=spec.step_shrink,
            on_exhausted=spec.on_exhausted,
        )
        self.pad_token_id = self.tokenizer.pad_token_id
        self.value_head = (
            ValueHead(self.model.config.hidden_size, spec.value_lr, spec.device)
            if spec.value_lr is not None
            else None
        )

    # --- forward passes ------------------------------------------------------------------------

    def _micro_batches(self, trajectories: list[Trajectory]) -> Iterator[tuple[slice, PaddedBatch]]:
        size = self.spec.micro_batch_size
        for start in range(0, len(trajectories), size):
            rows = slice(start, min(start + size, len(trajectories)))
            batch = pad_batch(trajectories[rows], self.pad_token_id)
            yield rows, batch.to(self.spec.device)

    @torch.no_grad()
    def _per_token(
        self, trajectories: list[Trajectory], compute: Callable[[PaddedBatch], torch.Tensor]
    ) -> torch.Tensor:
        """compute(micro-batch) [n, T_mb] gathered into [N, T] (T = longest response), on CPU."""
        T = max(len(t.response_ids) for t in trajectories)
        out = torch.zeros(len(trajectories), max(T, 1))
        for rows, batch in self._micro_batches(trajectories):
            values = compute(batch)
            out[rows, : values.shape[1]] = values.float().cpu()
        return out

    def logprobs(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """Teacher-forced log-probs at the sampling temperature, [N, T]."""
        return self._per_token(
            trajectories, lambda batch: response_logprobs(self.model, batch, self.spec.temperature)
        )

    def values(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """`gae` mode: V(s_t) before every response token, [N, T]."""
        return self._per_token(
            trajectories, lambda batch: self.value_head(response_hidden_states(self.model, batch))
        )

    def fit_values(self, trajectories: list[Trajectory], returns: torch.Tensor) -> float:
        """`gae` mode: `value_steps` steps of the value head towards the GAE returns [N, T] on
        the agent's tokens, with the current (updated) weights' hidden states. Returns the
        loss before the last step."""
        hidden, targets, masks = [], [], []
        with torch.no_grad():
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

    def update(
        self,
        trajectories: list[Trajectory],
        logp_cur: torch.Tensor,
        A: torch.Tensor,
        c: torch.Tensor,
    ) -> UpdateResult:
        """`update_steps` trust-region steps on the agent's tokens of `trajectories`.

        logp_cur [N, T]: behaviour log-probs (stage-start weights, sampling temperature);
        A, c [N]: advantages and truncated IS weights per trajectory.
        """
        started = time.perf_counter()
        spec = self.spec
        micro_batches = list(self._micro_batches(trajectories))  # padded once, used every attempt
        masks = [
            owner_mask(b.owner_ids, [spec.agent_index], b.response_mask) for _, b in micro_batches
        ]
        counts = [
            m.sum() if spec.loss.aggregation == "token_mean" else (m.sum(-1) > 0).sum()
            for m in masks
        ]
        total = float(sum(counts))
        reference = self._reference_model() if spec.loss.kl_estimator == "exact" else None
        logp_hat = logp_cur.clone()  # the agent's tokens under its unchanged weights
        stats: dict[str, float] = {"loss": 0.0, "clip_fraction": 0.0}
        logp_after_attempt: list[torch.Tensor] = []

        def take_step(beta: float, step_scale: float) -> float:
            for group in self.optimizer.param_groups:
                group["lr"] = spec.lr * step_scale
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum = clip_sum = 0.0
            for (rows, batch), mask, count in zip(micro_batches, masks, counts, strict=True):
                if count == 0:
                    continue
                T_mb = mask.shape[1]
                logp_vocabulary = vocabulary_logprobs(
                    response_logits(self.model, batch), spec.temperature
                )
                logp = gather_token_logprobs(logp_vocabulary, batch.response_ids)
                pl = policy_loss(
                    logp,
                    logp_cur[rows, :T_mb].to(logp.device),
                    A[rows].to(logp.device),
                    mask,
                    c=c[rows].to(logp.device),
                    ratio=spec.loss.ratio,
                    eps_low=spec.loss.eps_low,
                    eps_high=spec.loss.eps_high,
                    dual_clip=spec.loss.dual_clip,
                    aggregation=spec.loss.aggregation,
                )
                loss = pl.loss
                if beta > 0:
                    per_token_kl = self._per_token_kl(
                        logp_vocabulary, logp, logp_cur[rows, :T_mb], batch, reference
                    )
                    loss = loss + kl_penalty(per_token_kl, mask, beta)
                weight = float(count) / total
                (loss * weight).backward()
                loss_sum += loss.item() * weight
                clip_sum += pl.clip_fraction * weight
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), spec.grad_clip)
            self.optimizer.step()
            stats.update(loss=loss_sum, clip_fraction=clip_sum)
            q, logp_new = self._kl_quantile_and_logprobs(micro_batches, logp_cur, masks, reference)
            logp_after_attempt.append(logp_new)
            return q

        steps = []
        for _ in range(spec.update_steps):
            if total == 0:
                break
            if not spec.trust_region:  # every step is taken; q is still measured and logged
                q = take_step(0.0, 1.0)
                steps.append(StepOutcome(StepDecision.ACCEPT, 0, [q], 0.0))
                logp_hat = logp_after_attempt[-1]
                continue
            outcome = trust_region_step(
                self.region,
                take_step,
                save=lambda: snapshot_training_state(self.model, self.optimizer),
                restore=lambda snapshot: restore_training_state(
                    self.model, self.optimizer, snapshot
                ),
            )
            steps.append(outcome)
            if outcome.applied:
                logp_hat = logp_after_attempt[-1]
        tokens = int(sum(m.sum() for m in masks))
        return UpdateResult(
            logp_hat=logp_hat,
            steps=steps,
            loss=stats["loss"],
            clip_fraction=stats["clip_fraction"],
            tokens=tokens,
            seconds=time.perf_counter() - started,
        )

    def _reference_model(self) -> torch.nn.Module:
        """A frozen copy of the current (stage-start) weights, for the exact KL's π_cur logits."""
        reference = copy.deepcopy(self.model)
        reference.eval()
        reference.requires_grad_(False)
        return reference

    def _per_token_kl(self, logp_vocabulary, logp, logp_cur_rows, batch, reference) -> torch.Tensor:
        """KL(π_θ ‖ π_cur) per response token, [n, T_mb]; logp_vocabulary [n, T_mb, V] is
        π_θ's at the sampling temperature (computed once, for the loss and the KL)."""
        if reference is None:
            return kl_k3(logp, logp_cur_rows.to(logp.device))
        with torch.no_grad():
            reference_logp = vocabulary_logprobs(
                response_logits(reference, batch), self.spec.temperature
            )
        return kl_exact_from_logprobs(logp_vocabulary, reference_logp)

    @torch.no_grad()
    def _kl_quantile_and_logprobs(
        self, micro_batches, logp_cur, masks, reference
    ) -> tuple[float, torch.Tensor]:
        """After a step: q over the agent's sequences, and the new log-probs [N, T]."""
        seq_kls = []
        logp_new = torch.zeros_like(logp_cur)
        for (rows, batch), mask in zip(micro_batches, masks, strict=True):
            logp_vocabulary = vocabulary_logprobs(
                response_logits(self.model, batch), self.spec.temperature
            )
            logp = gather_token_logprobs(logp_vocabulary, batch.response_ids)
            logp_new[rows, : logp.shape[1]] = logp.float().cpu()
            per_token_kl = self._per_token_kl(
                logp_vocabulary, logp, logp_cur[rows, : logp.shape[1]], batch, reference
            )
            owns = mask.sum(-1) > 0
            seq_kls.append(sequence_kl(per_token_kl, mask)[owns].float().cpu())
        q = kl_quantile(torch.cat(seq_kls), self.spec.alpha)
        return q, logp_new

    # --- weights and state ---------------------------------------------------------------------

    def weights(self) -> dict[str, torch.Tensor]:
        """The current weights as CPU tensors, named as in the HF model (for rollout engines)."""
        return {
            name: tensor.detach().to("cpu", copy=True)
            for name, tensor in self.model.state_dict().items()
        }

    def save_pretrained(self, directory: str) -> str:
        """An HF directory (weights + tokenizer) loadable by transformers and vLLM."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        return directory

    def state_dict(self) -> dict[str, Any]:
        """Everything resume needs: weights, optimiser, β_i, the value head and torch's RNG."""
        return {
            "model": self.weights(),
            "optimizer": self.optimizer.state_dict(),
            "trust_region": self.region.state_dict(),
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.region.load_state_dict(state["trust_region"])
        if self.value_head is not None:
            self.value_head.load_state_dict(state["value_head"])
        torch.set_rng_state(state["rng"])

    def ready(self) -> bool:
        return True


LearnerActor = ray.remote(Learner)
