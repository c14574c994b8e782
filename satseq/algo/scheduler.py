"""The order in which SAT-Seq updates its agents within a stage (design §4 "Scheduler").

Modes:
    static       the config order, every stage.
    random       a permutation drawn from (seed, stage) alone, so a resumed run reproduces it.
    greedy_gain  descending by each agent's held-out gain estimate from the last stage (the
                 bandit estimate over its own held-out tokens; never the theorem's terms, which
                 the KL term dominates); on the first stage (no gains yet) descending by the
                 agent's mean |A|. Ties keep the config order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

SCHEDULER_MODES = ("static", "random", "greedy_gain")


def order_by_score(agents: Sequence[str], score: dict[str, float]) -> list[str]:
    """``agents`` sorted by ``score`` descending; ties keep the given order, NaN goes last."""
    missing = [agent for agent in agents if agent not in score]
    if missing:
        raise ValueError(f"scheduler greedy_gain: no score for agents {missing}")
    return sorted(agents, key=lambda agent: (math.isnan(score[agent]), -score[agent]))


class AgentScheduler:
    """sigma = scheduler(stats): the per-stage agent order."""

    def __init__(self, agents: Sequence[str], mode: str = "static", seed: int = 0):
        if mode not in SCHEDULER_MODES:
            raise ValueError(f"scheduler mode {mode!r} is unknown; use one of {SCHEDULER_MODES}")
        if len(set(agents)) != len(agents):
            raise ValueError(f"scheduler: agent names must be distinct, got {list(agents)}")
        self.agents = list(agents)
        self.mode = mode
        self.seed = seed

    def order(
        self,
        stage: int,
        last_gains: dict[str, float] | None = None,
        mean_abs_advantage: dict[str, float] | None = None,
    ) -> list[str]:
        """The agent order for ``stage``.

        Args:
            stage: the stage index; seeds the ``random`` permutation.
            last_gains: the previous stage's held-out gain estimate per agent (``greedy_gain``).
            mean_abs_advantage: mean |A| per agent on this stage's batch (``greedy_gain`` on
                the first stage, when ``last_gains`` is None or empty).
        """
        if self.mode == "static":
            return list(self.agents)
        if self.mode == "random":
            permutation = np.random.default_rng([self.seed, stage]).permutation(len(self.agents))
            return [self.agents[i] for i in permutation]
        if last_gains:
            return order_by_score(self.agents, last_gains)
        if mean_abs_advantage:
            return order_by_score(self.agents, mean_abs_advantage)
        raise ValueError(
            "scheduler greedy_gain needs last_gains (the previous stage's held-out gains) or, "
            "on the first stage, mean_abs_advantage"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"agents": list(self.agents), "mode": self.mode, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.agents = list(state["agents"])
        self.mode = state["mode"]
        self.seed = state["seed"]
