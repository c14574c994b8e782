"""Quantile-KL trust region with backtracking (DESIGN §4).

After each optimiser step the learner measures q, the (1 − α) quantile of the per-sequence
KL(π_θ ‖ π_cur) over agent i's sequences. If q > target_kl the step is undone (weights and
optimiser state restored), β_i grows ×1.5 and the step is retried. A step gets at most
1 + max_backtracks attempts; when the last one also violates, the step is exhausted: it is
rejected (weights as before the step) or, with on_exhausted="keep" (the official code's
behaviour), the violating step is kept. β_i persists across steps and stages.

Each retry also shrinks the step (`step_scale` = step_shrink^backtracks, applied by the learner
to its learning rate), as a backtracking line search does. β alone cannot do it: the gradient of
KL(π_θ ‖ π_cur) is zero at θ = π_cur, so a step that starts at the stage-start weights is the
same step whatever β is, and would violate again on every retry.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.distributed.tensor import DTensor


class StepDecision(enum.Enum):
    ACCEPT = "accept"  # q ≤ target: keep the step
    BACKTRACK = "backtrack"  # q > target: restore, β ← 1.5β, retry
    REJECT = "reject"  # exhausted: restore and give up this step
    KEEP = "keep"  # exhausted with on_exhausted="keep": keep the violating step


@dataclass
class TrustRegion:
    """The accept / backtrack / exhausted decision for one agent, and its persistent β_i."""

    target_kl: float
    alpha: float
    max_backtracks: int
    beta: float
    beta_growth: float = 1.5
    step_shrink: float = 0.5
    on_exhausted: Literal["reject", "keep"] = "reject"
    backtracks: int = field(default=0, init=False)  # backtracks taken in the current step

    @property
    def step_scale(self) -> float:
        """The factor on the step size for the current attempt: step_shrink^backtracks."""
        return self.step_shrink**self.backtracks

    def begin_step(self) -> None:
        self.backtracks = 0

    def judge(self, q: float) -> StepDecision:
        """Decide on an attempted step from its KL quantile q; grows β on every violation."""
        if q <= self.target_kl:
            return StepDecision.ACCEPT
        self.beta *= self.beta_growth  # β_i ← 1.5·β_i
        if self.backtracks >= self.max_backtracks:
            return StepDecision.KEEP if self.on_exhausted == "keep" else StepDecision.REJECT
        self.backtracks += 1
        return StepDecision.BACKTRACK

    def state_dict(self) -> dict[str, float]:
        return {"beta": self.beta}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.beta = float(state["beta"])


@dataclass(frozen=True)
class StepOutcome:
    decision: StepDecision  # ACCEPT, REJECT or KEEP (never BACKTRACK)
    backtracks: int
    kl_quantiles: list[float]  # q of every attempt, in order
    beta: float  # β_i after the step

    @property
    def applied(self) -> bool:
        """Whether the model now holds the new weights."""
        return self.decision in (StepDecision.ACCEPT, StepDecision.KEEP)


def trust_region_step(
    region: TrustRegion,
    take_step: Callable[[float, float], float],
    save: Callable[[], Any],
    restore: Callable[[Any], None],
) -> StepOutcome:
    """Run one trust-region step: attempt, judge, restore and retry until accepted or exhausted.

    take_step(beta, step_scale) performs one optimiser step with KL penalty β and the step size
    scaled by step_scale, and returns its KL quantile q.
    save() snapshots weights and optimiser state; restore(snapshot) puts them back.
    """
    region.begin_step()
    snapshot = save()
    quantiles: list[float] = []
    while True:
        q = take_step(region.beta, region.step_scale)
        quantiles.append(q)
        decision = region.judge(q)
        if decision in (StepDecision.ACCEPT, StepDecision.KEEP):
            return StepOutcome(decision, region.backtracks, quantiles, region.beta)
        restore(snapshot)
        if decision is StepDecision.REJECT:
            return StepOutcome(decision, region.backtracks, quantiles, region.beta)


class TrainingSnapshot:
    """Weights and optimiser state kept off the accelerator, in CPU buffers reused across steps
    (pinned where the source is on a GPU, so the copies run asynchronously on its stream).

    `save` copies the parameters and each parameter's optimiser state into the buffers (one per
    tensor, allocated on first use); `restore` copies them back in place. A sharded parameter
    (a DTensor, FSDP2) and its state are saved and restored as this rank's shard. Stream order
    makes the asynchronous device-to-host copies finish before the optimiser step that follows
    overwrites the source; the host waits only in `restore`.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self.model: dict[str, torch.Tensor] = {}
        self.optimizer: dict[str, Any] = {}

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainingSnapshot:
        self.model = {
            name: self._copy_out(f"model/{name}", param) for name, param in model.named_parameters()
        }
        self.optimizer = {
            "state": {
                index: {
                    key: self._copy_out(f"optimizer/{index}/{key}", value)
                    if isinstance(value, torch.Tensor)
                    else copy.deepcopy(value)
                    for key, value in optimizer.state[param].items()
                }
                for index, param in enumerate(_parameters(optimizer))
                if param in optimizer.state
            },
            "param_groups": [
                {key: copy.deepcopy(value) for key, value in group.items() if key != "params"}
                for group in optimizer.param_groups
            ],
        }
        return self

    @torch.no_grad()
    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if any(buffer.is_pinned() for buffer in self._buffers.values()):
            torch.cuda.synchronize()  # the host reads the pinned buffers below
        for name, param in model.named_parameters():
            local_shard(param).copy_(self.model[name], non_blocking=True)
        saved_state = self.optimizer["state"]
        for index, param in enumerate(_parameters(optimizer)):
            if index not in saved_state:  # no step had been taken: AdamW starts afresh
                optimizer.state.pop(param, None)
                continue
            state = optimizer.state[param]
            for key, value in saved_state[index].items():
                if isinstance(value, torch.Tensor):
                    local_shard(state[key]).copy_(value, non_blocking=True)
                else:
                    state[key] = copy.deepcopy(value)
        saved_groups = self.optimizer["param_groups"]
        for group, saved in zip(optimizer.param_groups, saved_groups, strict=True):
            group.update(copy.deepcopy(saved))

    @property
    def nbytes(self) -> int:
        return sum(buffer.nbytes for buffer in self._buffers.values())

    def _copy_out(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        tensor = local_shard(tensor.detach())
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(
                tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=tensor.is_cuda
            )
            self._buffers[key] = buffer
        return buffer.copy_(tensor, non_blocking=buffer.is_pinned())


def _parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [param for group in optimizer.param_groups for param in group["params"]]


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded (DTensor) tensor; a plain tensor as it is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def snapshot_training_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    into: TrainingSnapshot | None = None,
) -> TrainingSnapshot:
    """The model's weights and the optimiser's state, copied off the accelerator (into the
    buffers of `into` when given, so a learner allocates them once)."""
    return (into or TrainingSnapshot()).save(model, optimizer)


def restore_training_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, snapshot: TrainingSnapshot
) -> None:
    """Put back exactly what `snapshot_training_state` saved."""
    snapshot.restore(model, optimizer)
