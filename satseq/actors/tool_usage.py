"""How much a batch of samples used the sandbox (training's per-stage metrics, eval's summary)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def tool_usage(tool_calls: Sequence[int], statuses: dict[str, int]) -> dict[str, Any]:
    """How much samples used the sandbox, as training logs it per stage and `satseq eval`
    writes it to summary.json.

    Args:
        tool_calls: each sample's number of sandbox runs (`Generation.meta["tool_calls"]`).
        statuses: the sandbox pool's execution counts by status (`SandboxPool.metrics()`).

    Returns:
        {"call_fraction": share of samples that ran code, "calls_mean": runs per sample,
        "statuses": {status: count}}.
    """
    n = max(len(tool_calls), 1)
    return {
        "call_fraction": sum(calls > 0 for calls in tool_calls) / n,
        "calls_mean": sum(tool_calls) / n,
        "statuses": dict(statuses),
    }
