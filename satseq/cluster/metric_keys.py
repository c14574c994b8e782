"""How metrics.jsonl keys are spelled, for the code that reads them back (the report, the Ray
gauges). Kept free of heavy imports so that `satseq report` starts fast."""

from __future__ import annotations

import math
from typing import Any

TEAM_REWARD_PREFIX = "reward/mean/"  # `reward/mean/<agent>` names the team's agents
PHASE_PREFIX = "time/"  # `time/<phase>`: seconds the stage spent in that phase
PEAK_MEMORY = "memory/peak_gib"  # `memory/peak_gib/<agent>`: the update's peak device memory
RUN_TOKENS = "tokens/run_total"  # the tokens generated for training so far in the run


def stage_tokens(record: dict[str, Any]) -> int:
    """The tokens a stage's engines generated for training: the groups it trained on
    (`tokens/generated`) and those dynamic sampling dropped (`tokens/dropped`)."""
    return record.get("tokens/generated", 0) + record.get("tokens/dropped", 0)


def agent_names(record: dict[str, Any]) -> list[str]:
    """The team's agents, in record order: the names in the `reward/mean/<agent>` keys."""
    return [k.removeprefix(TEAM_REWARD_PREFIX) for k in record if k.startswith(TEAM_REWARD_PREFIX)]


def is_scalar(value: Any) -> bool:
    """A finite int or float (not a bool): what TensorBoard and Prometheus can plot."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
