"""The team's deployment, worked out once from the run config: `TeamPlan` (design §11, §12).

Each deployment fact is computed here and only here: an agent's offload and learner ranks,
whether the engines share the learners' devices (and sleep while they work), whether stages
overlap, which path weights take to the engines, and the engines' options. `RunConfig.plan`
builds it once; the config's checks, placement, the launch settings, the memory plan and the
runtime read it, and none derives a fact from the raw fields again
(tests/test_deployment_facts.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from satseq.config.rollout import RolloutConfig
from satseq.config.section import Offload
from satseq.config.team import TeamConfig
from satseq.config.trainer import TrainerConfig

TransferBackend = Literal["nccl", "gloo"]
"""A collective weight sync's backend: NCCL between GPUs, gloo on the CPU."""


@dataclass(frozen=True)
class AgentPlan:
    """Agent i's learner: where it keeps its idle state, and over how many ranks it is
    sharded."""

    offload: Offload
    """Its own `offload`, else `trainer.offload`."""
    workers: int
    """W, its learner ranks: its own `workers`, else `trainer.workers_per_agent`."""
    workers_key: str
    """The key that set `workers` (for error messages)."""

    @property
    def shares_devices(self) -> bool:
        """Whether its learner lends its devices to the engines between its updates (`offload:
        idle_agents`: its state waits in host memory)."""
        return self.offload == "idle_agents"


@dataclass(frozen=True)
class TeamPlan:
    """Where the team's learners and engines run, and how weights reach the engines."""

    agents: tuple[AgentPlan, ...]
    """Agent i's learner at index i."""
    overlapped: bool
    """Whether a stage's generation runs while the previous stage's learners update
    (`rollout.max_staleness` ≥ 1)."""
    engines_share_devices: bool
    """Whether the rollout engines share their devices with the learners: some agent keeps its
    idle state in host memory, so the engines sleep while learners work."""
    records_behaviour_logprobs: bool
    """Whether the engines report each sampled token's log-prob under the distribution it was
    drawn from: the correction reads them, and so do stale rollouts' certificates."""
    vllm_on_gpus: bool
    """Whether the engines are vLLM on GPUs, each taking `rollout.gpu_memory_utilization` of
    its GPU."""
    engine: str
    """`rollout.engine`."""
    weight_sync: str
    """`rollout.weight_sync`: auto, object_store or collective."""
    share_lora_learners: bool
    """`trainer.share_lora_learners`: the LoRA agents of one base share a learner process."""
    engine_options: dict[str, Any] = field(hash=False)
    """The rollout engines' options (read-only: `launch.settings.engine_options` gives a copy):
    torch threads per CPU core of the actor, the output layer's precision (`trainer.fp32_head`,
    as the learner computes it), with the behaviour log-probs their mode, merged LoRA engines
    where `rollout.lora_engines` asks for them, and for vLLM on a GPU
    its share of the memory and, when the engines share the learners' devices, its sleep
    mode."""

    @classmethod
    def of(cls, team: TeamConfig, trainer: TrainerConfig, rollout: RolloutConfig) -> TeamPlan:
        """The plan of a run config's sections (`RunConfig.plan`)."""
        agents = tuple(
            AgentPlan(
                agent.offload or trainer.offload,
                agent.workers or trainer.workers_per_agent,
                f"team.agents.{i}.workers" if agent.workers else "trainer.workers_per_agent",
            )
            for i, agent in enumerate(team.agents)
        )
        shared = any(agent.shares_devices for agent in agents)
        overlapped = rollout.max_staleness > 0
        behaviour = rollout.correction.mode != "off" or overlapped
        vllm_on_gpus = rollout.engine == "vllm" and rollout.resources.num_gpus > 0
        options: dict[str, Any] = {
            "num_threads": max(1, int(rollout.resources.num_cpus)),
            "fp32_head": trainer.fp32_head,  # the learner's precision, on both sides
        }
        if rollout.lora_engines == "merged":
            options["lora_engines"] = "merged"  # `actors.engines.lora.team_engines`
        if rollout.engine == "vllm" and behaviour:
            # the rollout correction reads each sampled token's log-prob under the sampling
            # distribution (design §12)
            options["logprobs_mode"] = "processed_logprobs"
        if vllm_on_gpus:
            options["gpu_memory_utilization"] = rollout.gpu_memory_utilization
            if shared:
                options["enable_sleep_mode"] = True
        return cls(
            agents,
            overlapped,
            shared,
            behaviour,
            vllm_on_gpus,
            rollout.engine,
            rollout.weight_sync,
            trainer.share_lora_learners,
            options,
        )

    def weight_transfer(self, learner_gpus: float, rollout_gpus: float) -> TransferBackend | None:
        """How learners reach the engines (`rollout.weight_sync`), given the GPUs each learner
        and rollout actor was placed with: a collective's backend, or None for the object
        store. NCCL needs learners and engines on GPUs of their own (one GPU cannot be two
        ranks of a group); gloo runs where both are on the CPU."""
        mode = self.weight_sync
        own_gpus = learner_gpus >= 1 and rollout_gpus >= 1
        on_cpu = learner_gpus == 0 and rollout_gpus == 0
        if mode == "object_store" or (mode == "auto" and not own_gpus):
            return None
        if mode == "auto":  # whole GPUs: NCCL where vLLM takes it and the engines stay awake
            awake = not self.engines_share_devices
            return "nccl" if self.engine == "vllm" and awake else None
        if not (own_gpus or on_cpu):
            raise ValueError(
                "rollout.weight_sync: collective needs learners and rollout actors on GPUs of "
                f"their own or both on the CPU; they hold {learner_gpus} and "
                f"{rollout_gpus} GPUs (trainer.resources / rollout.resources.num_gpus): "
                "use 1 each, or rollout.weight_sync: object_store"
            )
        return "nccl" if own_gpus else "gloo"
