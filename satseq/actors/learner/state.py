"""A learner's resume state in and out (the checkpoint's learner file, design §8): float32
master weights, optimiser, β_i, the value head and torch's RNG, written atomically; sharded,
each rank's shards in a `torch.distributed.checkpoint` directory. A LoRA agent's weights are its
adapter's, with the adapter's rank: a checkpoint of another rank is refused, naming both."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from satseq.actors.learner.policy import AgentPolicy
from satseq.actors.learner.snapshot import trained_parameters
from satseq.actors.value_head import ValueHead
from satseq.algo.trust_region import TrustRegion
from satseq.files import write_atomically


class LearnerState:
    """What of a learner resume restores: its policy's weights and optimiser, its trust region
    and its value head."""

    def __init__(self, policy: AgentPolicy, region: TrustRegion, value_head: ValueHead | None):
        self.policy = policy
        self.region = region
        self.value_head = value_head

    def state_dict(self) -> dict[str, Any]:
        """Everything resume needs. The weights are the live tensors (torch.save copies them to
        the file); sharded, this rank's shards (`torch.distributed.checkpoint` state)."""
        policy = self.policy
        policy.reshard()
        return {
            "model": (
                {name: param.detach() for name, param in trained_parameters(policy.model)}
                if policy.lora is not None
                else policy.model.state_dict()
            ),
            "lora_rank": None if policy.lora is None else policy.lora["r"],
            "optimizer": (
                get_optimizer_state_dict(policy.trunk, policy.optimizer)
                if policy.group.sharded
                else policy.optimizer.state_dict()
            ),
            "trust_region": self.region.state_dict(),
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load `state_dict()`'s output (the weights must be resident: AdamW's state takes its
        parameters' dtype and device)."""
        policy = self.policy
        policy.reshard()
        check_same_lora_rank(state.get("lora_rank"), policy)
        if policy.group.sharded:  # the shards were loaded in place (`load`)
            set_optimizer_state_dict(policy.trunk, policy.optimizer, state["optimizer"])
        else:
            loaded = policy.model.load_state_dict(state["model"], strict=policy.lora is None)
            trained = {name for name, _ in trained_parameters(policy.model)}
            missing = sorted(trained & set(loaded.missing_keys))
            if loaded.unexpected_keys or missing:  # a LoRA adapter on other layers
                raise ValueError(
                    f"the checkpoint's adapter is not this learner's: it lacks {missing[:3]} "
                    f"and has {loaded.unexpected_keys[:3]} (team.agents[i].lora.target_modules)"
                )
            policy.optimizer.load_state_dict(state["optimizer"])
        self.region.load_state_dict(state["trust_region"])
        if self.value_head is not None:
            self.value_head.load_state_dict(state["value_head"])
        torch.set_rng_state(state["rng"])

    def save(self, path: str) -> str:
        """Write `state_dict()` to `path` atomically; nothing of it is returned through the
        caller. Sharded: every rank writes its shards into the directory `path`, made whole
        under another name and renamed by rank 0 once all have written."""
        group = self.policy.group
        if not group.sharded:
            write_atomically(path, lambda handle: torch.save(self.state_dict(), handle))
            return path
        partial = group.gather(f"{path}.partial-{uuid.uuid4().hex}")[0]
        dcp.save(self.state_dict(), checkpoint_id=partial)  # ends with a barrier
        if group.rank == 0:
            shutil.rmtree(path, ignore_errors=True)  # a retried stage's
            Path(partial).rename(path)
        group.gather(None)  # the checkpoint is whole on return, on every rank
        return path

    def load(self, path: str) -> None:
        """Load what `save` wrote."""
        if not self.policy.group.sharded:
            self.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))
            return
        self.policy.reshard()
        state = self.state_dict()
        dcp.load(state, checkpoint_id=path)  # into this rank's shards, in place
        self.load_state_dict(state)


def check_same_lora_rank(saved: int | None, policy: AgentPolicy) -> None:
    """A checkpoint's adapter rank (None: a full model) must be the learner's."""
    mine = None if policy.lora is None else policy.lora["r"]
    if saved == mine:
        return
    what = {None: "a full model"}
    raise ValueError(
        f"the checkpoint holds {what.get(saved, f'a LoRA adapter of rank {saved}')}, but agent "
        f"{policy.spec.agent_index}'s learner is {what.get(mine, f'a LoRA adapter of rank {mine}')}"
        " (team.agents[i].lora / trainer.lora): resume with the configuration that wrote it"
    )
