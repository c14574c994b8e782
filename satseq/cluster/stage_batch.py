"""One stage's scored trajectories as the [N, T] tensors the recipes compute with."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from satseq.actors.trajectory import Trajectory, pad_batch
from satseq.algo import owner_mask


@dataclass(frozen=True)
class StageBatch:
    """One stage's trajectories, ordered group by group, as tensors [N, T]."""

    trajectories: list[Trajectory]
    rewards: torch.Tensor  # [N]
    owner_ids: torch.Tensor  # [N, T]
    response_mask: torch.Tensor  # [N, T]
    owns: torch.Tensor  # [n_agents, N]: whether agent i wrote any trained token of trajectory n
    n_train: int  # the first n_train trajectories train; the rest are held out for the bound
    behaviour_logprobs: torch.Tensor  # [N, T]: the engines' log π_behaviour (0 if not recorded)

    @classmethod
    def build(
        cls, trajectories: list[Trajectory], n_agents: int, n_train: int | None = None
    ) -> StageBatch:
        padded = pad_batch(trajectories, pad_token_id=0)
        owns = torch.stack(
            [
                owner_mask(padded.owner_ids, [i], padded.response_mask).sum(-1) > 0
                for i in range(n_agents)
            ]
        )
        rewards = torch.tensor([t.reward for t in trajectories])
        n_train = len(trajectories) if n_train is None else n_train
        behaviour = torch.zeros(padded.response_mask.shape)
        for row, t in enumerate(trajectories):
            if t.behaviour_logprobs is not None:
                behaviour[row, : len(t.behaviour_logprobs)] = torch.tensor(t.behaviour_logprobs)
        return cls(
            trajectories, rewards, padded.owner_ids, padded.response_mask, owns, n_train, behaviour
        )

    def owned_by(self, agents: list[int]) -> torch.Tensor:
        return owner_mask(self.owner_ids, agents, self.response_mask)

    def rows_of(self, agent: int, rows: range | None = None) -> list[int]:
        rows = range(len(self.trajectories)) if rows is None else rows
        return [i for i in rows if self.owns[agent, i]]
