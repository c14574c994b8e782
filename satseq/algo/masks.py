"""Token masks: which response tokens belong to which agent.

Every trajectory carries per-token owner ids (design §3), so losses, IS weights and metrics
can be restricted to one agent's tokens. Owner id -1 marks tokens no agent wrote (prompt,
padding, tool output).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

NO_OWNER = -1


def owner_mask(
    owner_ids: torch.Tensor, agents: Iterable[int], response_mask: torch.Tensor
) -> torch.Tensor:
    """Float mask [B, T]: 1 where a trained response token was written by one of `agents`.

    owner_ids [B, T] int, response_mask [B, T] (1 = trainable response token).
    """
    agent_ids = torch.as_tensor(list(agents), dtype=owner_ids.dtype, device=owner_ids.device)
    owned = torch.isin(owner_ids, agent_ids)
    return owned.to(response_mask.dtype) * response_mask


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum of `values` where mask is 1, along `dim`."""
    return (values * mask).sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where mask is 1; 0 where the mask is empty (no token contributes)."""
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp_min(1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp_min(1.0)
