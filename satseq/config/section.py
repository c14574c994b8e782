"""The base of every config section, and the types sections share."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


Offload = Literal["none", "idle_agents"]
"""Where a learner keeps its float32 master weights and AdamW state between its updates: on its
device (none), or in host memory (idle_agents: for a team that shares its GPUs)."""
