"""The run configuration: one pydantic model per object it builds (DESIGN §2, STYLE).

Every section forbids unknown keys, so a typo fails with the key's path instead of being
silently ignored. Seeds' keys (`algorithm.gamma`, `algorithm.lam`, `algorithm.kl_ctrl.*`,
`sat_seq.{epsilon, A_clip, group_size, max_backtracks, agents}`) are accepted as they are.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from satseq.data.synthetic import resolve_difficulty
from satseq.sandbox.types import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    MAX_MEMORY_MB,
    MAX_OUTPUT_BYTES,
    MAX_TIMEOUT_S,
    MIN_MEMORY_MB,
)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


Offload = Literal["none", "idle_agents"]
"""Where a learner keeps its float32 master weights and AdamW state between its updates: on its
device (none), or in host memory (idle_agents: for a team that shares its GPUs)."""


class AgentConfig(Section):
    name: str = Field(min_length=1, description="unique agent name; outputs go to agent_<name>/")
    path: str = Field(
        min_length=1, description="HF model dir or hub name; 'builtin:tiny' = the embedded model"
    )
    role_prompt: str | None = Field(
        None, description="chain topology: this agent's role instruction"
    )
    offload: Offload | None = Field(None, description="this agent's trainer.offload; None: that")
    workers: int | None = Field(
        None, ge=1, description="this agent's trainer.workers_per_agent; None: that"
    )


class SwapConfig(Section):
    """Plug-and-play: at the start of stage `at_stage`, agent `agent` is replaced by the model at
    `path` (same tokenizer), first projected towards the outgoing policy (mean per-state KL ≤
    delta0), then trained on by a fresh learner."""

    agent: str = Field(min_length=1, description="the team agent to replace")
    path: str = Field(min_length=1, description="the incoming model: HF dir, hub name, builtin:")
    at_stage: int = Field(ge=0, description="the swap happens before this stage")
    delta0: float = Field(
        0.05, gt=0.0, description="the projection's budget: mean per-state KL(π_new ‖ π_cur)"
    )
    max_steps: int = Field(
        100, ge=0, description="distillation steps at most (logged when the budget is not met)"
    )
    lr: float | None = Field(None, gt=0.0, description="distillation lr; None: trainer.lr")
    samples_per_prompt: int = Field(
        2, ge=1, description="the outgoing agent's samples per stage prompt (the KL's states)"
    )


class TeamConfig(Section):
    topology: Literal["mixture", "chain"] = "mixture"
    agents: list[AgentConfig] = Field(default_factory=list)
    swaps: list[SwapConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> TeamConfig:
        names = [a.name for a in self.agents]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"agent names must be unique, repeated: {duplicated}")
        for k, swap in enumerate(self.swaps):
            if names and swap.agent not in names:
                raise ValueError(
                    f"team.swaps[{k}].agent: {swap.agent!r} is not a team agent (agents: {names})"
                )
        slots = [(swap.agent, swap.at_stage) for swap in self.swaps]
        if len(set(slots)) < len(slots):
            raise ValueError("team.swaps: an agent is swapped twice at the same stage")
        return self


class KLControlConfig(Section):
    kl_coef: float = Field(0.01, ge=0.0, description="initial β_i of the KL penalty")
    target_kl: float = Field(0.05, gt=0.0, description="trust region: max allowed KL quantile")
    quantile: float = Field(
        0.9, gt=0.0, le=1.0, description="quantile level 1 − α of per-sequence KL"
    )
    beta_growth: float = Field(1.5, gt=1.0, description="β_i ← beta_growth·β_i on a violation")
    step_shrink: float = Field(
        0.5, gt=0.0, le=1.0, description="each retry scales the step size by this"
    )
    estimator: Literal["exact", "k3"] = "exact"
    max_backtracks: int = Field(3, ge=0, description="a step gets 1 + max_backtracks attempts")
    on_exhausted: Literal["reject", "keep"] = Field(
        "reject", description="after the last failed attempt: reject the step, or keep it"
    )


class CertificateConfig(Section):
    delta_conf: float = Field(
        0.05, gt=0.0, lt=1.0, description="PAC confidence: bound holds w.p. 1 − δ"
    )
    w_max: float = Field(
        2.0, gt=1.0, description="truncation of the sequence ratio in the bandit bound"
    )
    inequality: Literal["bernstein", "hoeffding"] = "bernstein"
    holdout_fraction: float = Field(
        0.25, ge=0.0, lt=1.0, description="prompts held out of the update for the bound"
    )


class AlgorithmConfig(Section):
    name: Literal["sat_seq", "spo", "grpo"] = "sat_seq"
    gamma: float = Field(0.99, gt=0.0, lt=1.0, description="discount in the theorem terms and GAE")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE λ")
    kl_ctrl: KLControlConfig = Field(default_factory=KLControlConfig)
    certificate: CertificateConfig = Field(default_factory=CertificateConfig)


class SatSeqConfig(Section):
    epsilon: float = Field(0.2, gt=0.0, lt=1.0, description="PPO clip ε")
    A_clip: float = Field(5.0, gt=0.0, description="advantages are clipped to ±A_clip")
    group_size: int = Field(8, ge=2, description="G trajectories per prompt")
    max_backtracks: int | None = Field(
        None, ge=0, description="seeds' spelling of algorithm.kl_ctrl.max_backtracks"
    )
    on_exhausted: Literal["reject", "keep"] | None = Field(
        None, description="seeds' spelling of algorithm.kl_ctrl.on_exhausted"
    )
    ratio: Literal["seq", "token", "seq_mean"] = "seq"
    advantage: Literal["grpo", "gae"] = Field(
        "grpo", description="grpo: group-normalised rewards; gae: a per-agent value head + GAE"
    )
    value_lr: float = Field(5e-3, gt=0.0, description="gae: the value head's AdamW lr")
    value_steps: int = Field(8, ge=1, description="gae: value-head steps per agent per stage")
    max_log_ratio: float = Field(5.0, gt=0.0, description="clamp of the IS log-ratio")
    scheduler: Literal["static", "random", "greedy_gain"] = "static"
    agents: list[AgentConfig] | None = Field(None, description="seeds' spelling of team.agents")


class SpoConfig(Section):
    rho: Literal["constant", "kl"] = "kl"
    rho_min: float = Field(0.875, gt=0.0, lt=1.0)
    rho_max: float = Field(0.96, gt=0.0, lt=1.0)
    d_half: float = Field(0.06, gt=0.0, description="D at which ρ halves")
    eps_low: float = Field(0.2, gt=0.0, lt=1.0)
    eps_high: float = Field(0.28, gt=0.0)
    dual_clip: float = Field(10.0, gt=1.0)
    gamma_s: float = Field(0.0, ge=0.0, description="sampling weight exponent on N_eff")
    candidate_pool_size: int = Field(256, ge=1)
    offline_values: str | None = Field(
        None, description="JSON {prompt: [scores]} from offline-values merge"
    )
    sample_unscored_prompts: bool = True

    @model_validator(mode="after")
    def _rho_order(self) -> SpoConfig:
        if self.rho_min > self.rho_max:
            raise ValueError(f"rho_min ({self.rho_min}) must not exceed rho_max ({self.rho_max})")
        return self


class GrpoConfig(Section):
    group_size: int = Field(8, ge=2)
    eps_low: float = Field(0.2, gt=0.0, lt=1.0)
    eps_high: float = Field(0.2, gt=0.0)
    dr_grpo: bool = Field(False, description="Dr.GRPO: no division by the group std")
    measure_step_kl: bool = Field(
        False,
        description="log kl_quantile/<agent>, the KL quantile between the policy before and "
        "after each step: one more forward pass over the batch per step",
    )


class EngineResources(Section):
    num_cpus: float = Field(1.0, ge=0.0)
    num_gpus: float = Field(0.0, ge=0.0)


class ToolConfig(Section):
    enabled: bool = False
    max_turns: int = Field(8, ge=1)
    max_tool_response_length: int = Field(512, ge=16, description="characters, middle-truncated")


class RolloutConfig(Section):
    engine: Literal["hf", "vllm"] = "hf"
    num_actors: int = Field(1, ge=1)
    temperature: float = Field(1.0, gt=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(256, ge=1)
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
    resources: EngineResources = Field(default_factory=EngineResources)
    tools: ToolConfig = Field(default_factory=ToolConfig)


class SandboxConfig(Section):
    backend: Literal["local", "sandbox_fusion"] = "local"
    url: str | None = Field(None, description="SandboxFusion base URL for backend sandbox_fusion")
    workers: int = Field(4, ge=1)
    queue_size: int = Field(
        256, ge=1, description="SandboxPool: waiting requests before callers block"
    )
    timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0.0, le=MAX_TIMEOUT_S)
    memory_mb: int = Field(DEFAULT_MEMORY_MB, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB)
    max_output_bytes: int = Field(DEFAULT_MAX_OUTPUT_BYTES, ge=1, le=MAX_OUTPUT_BYTES)
    max_processes: int = Field(64, ge=8, description="tasks (processes + threads) per run")
    max_open_files: int = Field(256, ge=16)
    disk_mb: int = Field(64, ge=1, description="size of each writable tmpfs; the largest file")
    cpus: float = Field(1.0, gt=0.0, description="CPU quota per slot, in cores")
    uid_base: int = Field(61000, ge=1000, description="slot uids are claimed from here (root only)")
    python: str | None = Field(
        None, description="interpreter in the sandbox; None: the running one"
    )
    bubblewrap: bool = True
    min_isolation: Literal["none", "rlimits", "namespaces", "full"] = Field(
        "full", description="refuse to start below this level (fail closed)"
    )

    @model_validator(mode="after")
    def _url_for_remote(self) -> SandboxConfig:
        if self.backend == "sandbox_fusion" and not self.url:
            raise ValueError("backend 'sandbox_fusion' needs sandbox.url")
        return self


class PromptConfig(Section):
    system_prompt: str | None = None
    instruction: str | None = Field(
        None,
        description="instruction after the problem; None: the SPO recipe's \\boxed{} wording",
    )
    tool_prompt: bool = False


class SyntheticDataConfig(Section):
    split: Literal["train", "test"] = Field(
        "train",
        description="split to train on: 'train'; 'test' is held out for `satseq eval` and "
        "validation, and the builtin models were warm-started on a third split, 'warmup' (the "
        "level-1 models builtin:tiny and builtin:tiny-tool on 'train' and 'warmup' both, so runs "
        "of those train on 'test')",
    )
    n_train: int = Field(
        256, ge=1, description="problems of the split (level 1 has ~350 train); stages cycle them"
    )
    difficulty: int | str = Field(
        1, description="a level 1-5 or a task name ('two_digit_sums', the quickstart's)"
    )
    style: Literal["symbols", "words", "mixed"] = "symbols"
    seed: int = 0

    @field_validator("difficulty")
    @classmethod
    def _known_difficulty(cls, difficulty: int | str) -> int | str:
        resolve_difficulty(difficulty)  # a DataError (a ValueError) names the known ones
        return difficulty


class DataConfig(Section):
    train: str = Field(
        "synthetic",
        description="'synthetic', a JSONL/parquet path, a directory of them, or an HF dataset name",
    )
    val_files: list[str] = Field(
        default_factory=list,
        description="validation sets: JSONL/parquet paths or names `satseq eval --dataset` takes",
    )
    split: str = "train"
    field_map: dict[str, str] | None = Field(
        None, description="e.g. {problem: question, answer: a.b}"
    )
    skip_bad_rows: bool = False
    synthetic: SyntheticDataConfig = Field(default_factory=SyntheticDataConfig)
    prompt: PromptConfig = Field(default_factory=PromptConfig)


class RewardConfig(Section):
    function: str | None = Field(None, description="'package.module:function' custom reward")
    fallbacks: list[Literal["answer_colon", "answer_is", "last_number"]] = Field(
        default_factory=list
    )
    allow_percent: bool = False
    format_rule: bool = Field(
        False, description="SPO format rule: exactly one </think>, no tools after"
    )
    timeout_s: float = Field(2.0, gt=0.0)


class TrainerConfig(Section):
    stages: int = Field(10, ge=1)
    batch_size: int = Field(8, ge=1, description="prompts per stage (B)")
    micro_batch_size: int = Field(8, ge=1)
    update_steps: int = Field(1, ge=1, description="trust-region steps per agent per stage")
    lr: float = Field(1e-5, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float = Field(1.0, gt=0.0)
    max_tokens_per_micro_batch: int | None = Field(
        None, ge=1, description="also cap a micro-batch's padded tokens (prompt + response)"
    )
    logit_chunk_tokens: int = Field(
        1024, ge=1, description="response tokens per output-layer chunk: logits are [chunk, V]"
    )
    gradient_checkpointing: bool = False
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
    save_every: int = Field(5, ge=1)
    max_stage_retries: int = Field(
        3, ge=0, description="retries of a stage after an actor or node died; then the run stops"
    )
    val_every: int = Field(
        0, ge=0, description="validate on data.val_files every N stages and at the end; 0: never"
    )
    seed: int = 0
    resources: EngineResources = Field(default_factory=EngineResources)


class EvalConfig(Section):
    """`satseq eval` and validation: K samples per agent per problem, scored by the team vote."""

    samples_per_agent: int = Field(4, ge=1, le=1024, description="K samples per agent and problem")
    # The seeds' SPO-style evaluation samples at T 0.6, top_p 0.95.
    temperature: float = Field(0.6, ge=0.0, le=2.0, description="0: greedy")
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0: no top-k")
    max_new_tokens: int | None = Field(None, ge=1, description="None: rollout.max_new_tokens")
    synthetic_problems: int = Field(
        64, ge=1, description="problems of a 'synthetic:<split>' dataset (after the trained ones)"
    )
    seed: int = 0


class ServeConfig(Section):
    """`satseq serve` and the Ray Serve application's `args` (configs/serve.yaml)."""

    checkpoint_dir: str | None = Field(
        None, description="training output dir (agent_<name>/stage_<k>/) or per-agent HF dirs"
    )
    stage: int | None = Field(None, ge=0, description="None: each agent's latest stage")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    engine: Literal["hf", "vllm"] = "hf"
    engine_threads: int = Field(1, ge=1, description="torch threads per agent replica (CPU)")
    samples_per_agent: int = Field(1, ge=1, description="default of a request's samples_per_agent")
    max_samples_per_agent: int = Field(16, ge=1, le=1024)
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="default; 0: greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(256, ge=1, description="default and upper bound of max_tokens")
    max_problem_chars: int = Field(8192, ge=1, description="longer problems get HTTP 413")
    timeout_s: float = Field(60.0, gt=0.0, description="per request; nothing back in time: 504")
    api_key_env: str | None = Field(
        "SATSEQ_API_KEY", description="env var holding the API key; unset or empty: no key needed"
    )
    seed: int = 0

    @model_validator(mode="after")
    def _default_within_bound(self) -> ServeConfig:
        if self.samples_per_agent > self.max_samples_per_agent:
            raise ValueError(
                f"samples_per_agent ({self.samples_per_agent}) exceeds max_samples_per_agent "
                f"({self.max_samples_per_agent})"
            )
        return self


class OutputConfig(Section):
    dir: str = "outputs"
    exp_name: str = "satseq"
    tensorboard: bool = True


class RunConfig(Section):
    team: TeamConfig = Field(default_factory=TeamConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    sat_seq: SatSeqConfig = Field(default_factory=SatSeqConfig)
    spo: SpoConfig = Field(default_factory=SpoConfig)
    grpo: GrpoConfig = Field(default_factory=GrpoConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)

    @model_validator(mode="after")
    def _one_agent_list(self) -> RunConfig:
        """`sat_seq.agents` (the seeds' key) and `team.agents` name the same list: merge them."""
        seeds_agents = self.sat_seq.agents
        if seeds_agents is not None:
            if self.team.agents and self.team.agents != seeds_agents:
                raise ValueError(
                    "team.agents and sat_seq.agents disagree: give the agent list once"
                )
            self.team = TeamConfig(
                topology=self.team.topology, agents=seeds_agents, swaps=self.team.swaps
            )
            self.sat_seq = self.sat_seq.model_copy(update={"agents": None})
        if not self.team.agents:
            raise ValueError("team.agents is empty: list at least one {name, path}")
        return self

    @model_validator(mode="after")
    def _collective_sync_needs_vllm_awake(self) -> RunConfig:
        """A collective weight sync goes into vLLM's weight-transfer API, and into engines that
        are awake: not the hf engine, nor engines that sleep while learners work."""
        if self.rollout.weight_sync != "collective":
            return self
        if self.rollout.engine != "vllm":
            raise ValueError(
                "rollout.weight_sync: collective needs rollout.engine: vllm (the hf engine "
                "takes weights through the object store: rollout.weight_sync: object_store)"
            )
        offloads = [self.trainer.offload] + [a.offload for a in self.team.agents if a.offload]
        if "idle_agents" in offloads:
            raise ValueError(
                "rollout.weight_sync: collective needs engines that stay awake; with "
                "trainer.offload (or team.agents[i].offload): idle_agents use object_store"
            )
        return self

    @model_validator(mode="after")
    def _one_backtracking_setting(self) -> RunConfig:
        """`sat_seq.max_backtracks` / `sat_seq.on_exhausted` (the seeds' keys) set the trust
        region's `algorithm.kl_ctrl.*` of the same name: the trust region is built from that one
        section."""
        kl_ctrl = self.algorithm.kl_ctrl
        for key in ("max_backtracks", "on_exhausted"):
            seeds_value = getattr(self.sat_seq, key)
            if seeds_value is None:
                continue
            if key in kl_ctrl.model_fields_set and getattr(kl_ctrl, key) != seeds_value:
                raise ValueError(
                    f"algorithm.kl_ctrl.{key} and sat_seq.{key} disagree: give the setting once"
                )
            kl_ctrl = kl_ctrl.model_copy(update={key: seeds_value})
            self.sat_seq = self.sat_seq.model_copy(update={key: None})
        self.algorithm = self.algorithm.model_copy(update={"kl_ctrl": kl_ctrl})
        return self
