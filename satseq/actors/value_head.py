"""`gae` mode's critic (design §4): a per-agent value head V(s_t) for GAE(γ, λ).

A linear head on the policy's last hidden state at each state s_t. It reads the hidden states
detached, so the value loss never moves the policy; it has its own AdamW and is fitted by the
masked mean squared error to the GAE returns of the agent's tokens. It starts at zero, so the
first stage's advantages are the discounted returns.
"""

from __future__ import annotations

from typing import Any

import torch

from satseq.algo.masks import masked_mean


class ValueHead:
    def __init__(self, hidden_size: int, lr: float, device: str):
        self.linear = torch.nn.Linear(hidden_size, 1, device=device)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)
        self.optimizer = torch.optim.AdamW(self.linear.parameters(), lr=lr, weight_decay=0.0)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """V(s_t) [n, T] from the hidden states [n, T, H], in float32 whatever their dtype (and
        outside the learner's autocast, so fitting and predicting compute alike)."""
        with torch.autocast(hidden.device.type, enabled=False):
            return self.linear(hidden.detach().float()).squeeze(-1)

    def fit(
        self, hidden: list[torch.Tensor], returns: list[torch.Tensor], masks: list[torch.Tensor]
    ) -> float:
        """One AdamW step on ½·masked-mean (V − returns)² over all micro-batches; the loss
        before the step. hidden [n, T, H], returns and masks [n, T] per micro-batch."""
        total = float(sum(m.sum() for m in masks))
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for h, target, mask in zip(hidden, returns, masks, strict=True):
            count = float(mask.sum())
            if count == 0:
                continue
            loss = 0.5 * masked_mean((self(h) - target) ** 2, mask)
            (loss * count / total).backward()
            loss_sum += loss.item() * count / total
        self.optimizer.step()
        return loss_sum

    def state_dict(self) -> dict[str, Any]:
        return {"linear": self.linear.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.linear.load_state_dict(state["linear"])
        self.optimizer.load_state_dict(state["optimizer"])
