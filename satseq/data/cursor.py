"""The data cursor: which prompts a stage trains on, reproducible from its position alone."""

from __future__ import annotations

import numpy as np


class PromptCursor:
    """Walks `size` prompts in shuffled epochs; epoch e's order is a permutation seeded by
    (seed, e), so the state needed to resume is just (epoch, position)."""

    def __init__(self, size: int, seed: int):
        if size < 1:
            raise ValueError("the training set is empty: no prompts to sample")
        self.size, self.seed = size, seed
        self.epoch, self.position = 0, 0

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)

    def next(self, n: int) -> list[int]:
        """The next `n` prompt indices, crossing into the next epoch when this one runs out."""
        indices: list[int] = []
        while len(indices) < n:
            take = min(n - len(indices), self.size - self.position)
            indices += self._order(self.epoch)[self.position : self.position + take].tolist()
            self.position += take
            if self.position == self.size:
                self.epoch, self.position = self.epoch + 1, 0
        return indices

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
