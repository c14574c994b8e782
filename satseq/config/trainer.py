"""The `trainer:` section: the learners and the stage loop (design §2, §11)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from satseq.config.rollout import EngineResources
from satseq.config.section import Offload, Section
from satseq.config.team import LoraConfig


class TrainerConfig(Section):
    """The learners and the stage loop: optimizer, batches, precision, memory, checkpoints."""

    stages: int = Field(10, ge=1, description="stages to run (each: rollouts, then the updates)")
    max_generated_tokens: int | None = Field(
        None,
        ge=1,
        description="end the run after the stage in which the tokens generated for training "
        "(dynamic sampling's dropped groups included) reach N, to compare runs at equal tokens; "
        "trainer.stages still bounds it. None: no budget",
    )
    batch_size: int = Field(8, ge=1, description="prompts per stage (B)")
    micro_batch_size: int = Field(
        8, ge=1, description="trajectories per forward/backward pass (gradient accumulation)"
    )
    mini_batch_size: int | None = Field(
        None,
        ge=1,
        description="trajectories per optimiser step (the seeds' ppo_mini_batch_size, counted "
        "in trajectories): each epoch takes one step per shuffled mini-batch of an agent's "
        "stage batch; None: one step over the whole batch",
    )
    ppo_epochs: int = Field(
        1, ge=1, description="passes over an agent's stage batch, each checked by the trust region"
    )
    lr: float = Field(
        1e-5, gt=0.0, description="AdamW learning rate (a backtrack shrinks the step)"
    )
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay")
    grad_clip: float = Field(1.0, gt=0.0, description="max global gradient norm per step")
    max_tokens_per_micro_batch: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        None,
        description="also cap a micro-batch's tokens: its trajectories' prompt + response "
        "tokens (padded rows' where the model does not pack; a longer trajectory goes alone). "
        "auto: on a GPU, as many as fit beside the rest of the update in 90 % of the learner's "
        "GPU share by the memory plan (`satseq plan`); no cap on the CPU",
    )
    logit_chunk_tokens: int = Field(
        1024, ge=1, description="response tokens per output-layer chunk: logits are [chunk, V]"
    )
    gradient_checkpointing: bool | Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        False,
        description="recompute activations in backward (same results, less memory): true every "
        "decoder layer, k every k-th (layers 0, k, 2k, ...); auto: on a GPU, the fewest "
        "recomputed layers at which a micro-batch of micro_batch_size longest trajectories fits "
        "by the memory plan (`satseq plan`), every layer on the CPU",
    )

    def run_ends(self, stages_done: int, tokens_generated: int) -> bool:
        """Whether a run ends with `stages_done` stages done and `tokens_generated` generated
        for training: the stages are done, or the tokens reached `max_generated_tokens`."""
        budget = self.max_generated_tokens
        spent = budget is not None and tokens_generated >= budget
        return spent or stages_done >= self.stages

    @property
    def checkpoint_every(self) -> int | None:
        """`gradient_checkpointing` as a layer stride (None: off); auto reads as every layer,
        what it is wherever no plan chooses (the CPU)."""
        value = self.gradient_checkpointing
        if value is False:
            return None
        return 1 if value is True or value == "auto" else value

    fp32_head: bool = Field(
        True,
        description="the output layer's product float32-accurate under bf16 autocast (a float32 "
        "matmul; on a GPU's tensor cores, three bf16 products), in the learner and in the rollout "
        "engines alike (log-probs, KL and IS weights from float32-accurate logits)",
    )
    workers_per_agent: int = Field(
        1,
        ge=1,
        description="W learner ranks per agent, the model sharded over them with FSDP2 (NCCL "
        "on GPUs, gloo on the CPU); each rank takes a trainer.resources bundle",
    )
    offload: Offload = Field(
        "none",
        description="idle_agents: between its updates a learner keeps its master weights and "
        "AdamW state in host memory, and the rollout engines sleep while learners work",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="compute dtype (autocast); master weights and AdamW state are float32. "
        "auto: bfloat16 on a GPU, float32 on the CPU",
    )
    save_dtype: Literal["float32", "bfloat16"] | None = Field(
        None, description="HF checkpoints and engine weights; default: the compute dtype"
    )
    save_every: int = Field(
        5, ge=1, description="write agent_<name>/stage_<k>/ every N stages and after the last"
    )
    max_stage_retries: int = Field(
        3, ge=0, description="retries of a stage after an actor or node died; then the run stops"
    )
    val_every: int = Field(
        0, ge=0, description="validate on data.val_files every N stages and at the end; 0: never"
    )
    seed: int = Field(0, description="seeds prompt order, the scheduler, sampling, learners")
    resources: EngineResources = Field(
        default_factory=EngineResources,
        description="each learner process's bundle (a rank's, or the shared LoRA learners')",
    )
    lora: LoraConfig | None = Field(
        None, description="every agent a LoRA adapter on its path, unless team.agents[i].lora says"
    )
    share_lora_learners: bool = Field(
        True,
        description="the LoRA agents of one base share one learner process (one interpreter, "
        "torch and base; their calls take turns); false: a process each",
    )
