"""Quantile-KL trust region with backtracking (design §4).

After each optimiser step the learner measures q, the (1 − α) quantile of the per-sequence
KL(π_θ ‖ π_cur) over agent i's sequences. If q > target_kl the step is undone (weights and
optimiser state restored), β_i grows ×1.5 and the step is retried. A step gets at most
1 + max_backtracks attempts; when the last one also violates, the step is exhausted: it is
rejected (weights as before the step) or, with on_exhausted="keep" (the official code's
behaviour), the violating step is kept, unless q is not finite (NaN weights are never kept).
β_i persists across steps and stages.

Each retry also shrinks the step (`step_scale` = step_shrink^backtracks, applied by the learner
to its learning rate), as a backtracking line search does. β alone cannot do it: the gradient of
KL(π_θ ‖ π_cur) is zero at θ = π_cur, so a step that starts at the stage-start weights is the
same step whatever β is, and would violate again on every retry.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal


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
    quantiles: list[float] = field(default_factory=list, init=False)  # q of its attempts
    decision: StepDecision = field(default=StepDecision.ACCEPT, init=False)  # of the last one

    @property
    def step_scale(self) -> float:
        """The factor on the step size for the current attempt: step_shrink^backtracks."""
        return self.step_shrink**self.backtracks

    def judge(self, q: float) -> StepDecision:
        """Decide on an attempted step from its KL quantile q; grows β on every violation."""
        self.quantiles.append(q)
        self.decision = self._decide(q)
        return self.decision

    def _decide(self, q: float) -> StepDecision:
        if q <= self.target_kl:  # a NaN q (NaN weights after the step) is a violation
            return StepDecision.ACCEPT
        self.beta *= self.beta_growth  # β_i ← 1.5·β_i
        if self.backtracks >= self.max_backtracks:
            keep = self.on_exhausted == "keep" and math.isfinite(q)  # never keep NaN weights
            return StepDecision.KEEP if keep else StepDecision.REJECT
        self.backtracks += 1
        return StepDecision.BACKTRACK

    def attempts(
        self, save: Callable[[], Any], restore: Callable[[Any], None]
    ) -> Iterator[tuple[float, float]]:
        """One trust-region step: yields (β, step_scale) for each attempt until one is accepted
        or the step is exhausted. The caller takes the attempt (an optimiser step with KL
        penalty β and the step size scaled by step_scale) and passes its q to `judge` before
        the next. save() snapshots weights and optimiser state before the first attempt;
        restore(snapshot) puts them back after a backtrack or a rejection. `outcome` then says
        how the step ended."""
        self.backtracks = 0
        self.quantiles = []
        snapshot = save()
        while True:
            yield self.beta, self.step_scale
            if self.decision in (StepDecision.ACCEPT, StepDecision.KEEP):
                return
            restore(snapshot)
            if self.decision is StepDecision.REJECT:
                return

    @property
    def outcome(self) -> StepOutcome:
        """How the last step ended (after `attempts` is exhausted)."""
        return StepOutcome(self.decision, self.backtracks, list(self.quantiles), self.beta)

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
