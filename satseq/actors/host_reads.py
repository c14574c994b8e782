"""Reading a learner's device tensors back on the host, in one transfer.

Each read of an accelerator's tensor (`float(t)`, `.cpu()`, `.tolist()`, indexing by a bool
mask) waits for everything queued before it to finish, so a step that reads its statistics
micro-batch by micro-batch leaves the device idle between them. `read_back` moves a list of
tensors in one copy, once their values are all queued.
"""

from __future__ import annotations

import torch


def read_back(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """`tensors` (on one device) as float32 host tensors of the same shapes, in one transfer."""
    if not tensors:
        return []
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors]).cpu()
    parts = flat.split([t.numel() for t in tensors])
    return [part.view(t.shape) for part, t in zip(parts, tensors, strict=True)]


def read_back_rows(
    computed: list[tuple[list[int], torch.Tensor]],
) -> list[tuple[list[int], torch.Tensor]]:
    """(rows, values on the device) pairs with their values read back in one transfer."""
    values = read_back([values for _, values in computed])
    return [(rows, v) for (rows, _), v in zip(computed, values, strict=True)]
