"""The run configuration: one pydantic model per object it builds (design §2, STYLE).

Every section forbids unknown keys, so a typo fails with the key's path instead of being
silently ignored. Seeds' keys (`algorithm.gamma`, `algorithm.lam`, `algorithm.kl_ctrl.*`,
`sat_seq.{epsilon, A_clip, group_size}`) are today's keys; their other names for a key
(`sat_seq.agents`, `sat_seq.max_backtracks`, ...) are read by `config/legacy.py`.

`RunConfig` and the sections it holds directly are here; the larger sections live in modules of
their own (`team`, `trainer`, `algorithms`, `rollout`, `data`); import a section from where it
lives. The deployment the config asks for is `RunConfig.plan` (`config/team_plan.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from satseq.config.algorithms import (
    AlgorithmConfig,
    GrpoConfig,
    SatSeqConfig,
    SpoConfig,
)
from satseq.config.data import (
    DataConfig,
    RewardConfig,
)
from satseq.config.legacy import spell_as_today
from satseq.config.rollout import (
    RolloutConfig,
    SandboxConfig,
)
from satseq.config.section import Section
from satseq.config.team import (
    LoraConfig,
    TeamConfig,
)
from satseq.config.team_plan import TeamPlan
from satseq.config.trainer import TrainerConfig


class EvalConfig(Section):
    """`satseq eval` and validation: K samples per agent per problem, scored by the team vote."""

    samples_per_agent: int = Field(4, ge=1, le=1024, description="K samples per agent and problem")
    # The seeds' SPO-style evaluation samples at T 0.6, top_p 0.95.
    temperature: float = Field(0.6, ge=0.0, le=2.0, description="0: greedy")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="nucleus sampling; 1: none")
    top_k: int = Field(0, ge=0, description="0: no top-k")
    max_new_tokens: int | None = Field(None, ge=1, description="None: rollout.max_new_tokens")
    synthetic_problems: int = Field(
        64, ge=1, description="problems of a 'synthetic:<split>' dataset (after the trained ones)"
    )
    seed: int = Field(0, description="the sampling seed (each rollout actor's derives from it)")
    merge_lora: bool = Field(
        False,
        description="score each LoRA agent as its adapter merged into its base (made once in "
        "the model cache): a full model an agent, the same weights to rounding, several times "
        "faster than the adapter path of vLLM on the CPU",
    )
    rollout_cpus: float | None = Field(
        None,
        gt=0.0,
        description="`satseq eval`'s rollout actors' CPUs each, and so their CPU engines' "
        "threads (an evaluation runs no learner, whose CPUs training's rollout.resources leave "
        "free); None: rollout.resources.num_cpus. Validation during training is not affected",
    )


class ServeConfig(Section):
    """`satseq serve` and the Ray Serve application's `args` (configs/serve.yaml)."""

    checkpoint_dir: str | None = Field(
        None, description="training output dir (agent_<name>/stage_<k>/) or per-agent HF dirs"
    )
    stage: int | None = Field(None, ge=0, description="None: each agent's latest stage")
    host: str = Field("127.0.0.1", description="the HTTP address to listen on")
    port: int = Field(8000, ge=1, le=65535, description="the HTTP port (`--port` overrides)")
    engine: Literal["auto", "hf", "vllm"] = Field(
        "auto",
        description="each agent deployment's engine; auto: vllm where the replica has a GPU "
        "and vLLM is installed, else hf",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="the engines' weights; auto: bfloat16 on a GPU, float32 on the CPU"
    )
    engine_threads: int = Field(1, ge=1, description="torch threads per agent replica (CPU)")
    samples_per_agent: int = Field(1, ge=1, description="default of a request's samples_per_agent")
    max_samples_per_agent: int = Field(
        16, ge=1, le=1024, description="bound of a request's samples per agent (/v1: n × default)"
    )
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="default; 0: greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="default nucleus sampling; 1: none")
    max_tokens: int = Field(256, ge=1, description="default and upper bound of max_tokens")
    max_problem_chars: int = Field(8192, ge=1, description="longer problems get HTTP 413")
    timeout_s: float = Field(60.0, gt=0.0, description="per request; nothing back in time: 504")
    api_key_env: str | None = Field(
        "SATSEQ_API_KEY", description="env var holding the API key; unset or empty: no key needed"
    )
    seed: int = Field(0, description="the engines' sampling seed (one per agent from it)")

    @model_validator(mode="after")
    def _default_within_bound(self) -> ServeConfig:
        if self.samples_per_agent > self.max_samples_per_agent:
            raise ValueError(
                f"samples_per_agent ({self.samples_per_agent}) exceeds max_samples_per_agent "
                f"({self.max_samples_per_agent})"
            )
        return self


TrackerName = Literal["tensorboard", "mlflow", "wandb"]


class OutputConfig(Section):
    """Where a run writes, and which experiment trackers also get its metrics."""

    dir: str = Field("outputs", description="a run writes to dir/exp_name unless --output-dir")
    exp_name: str = Field("satseq", description="the run's directory under output.dir")
    keep_last: int | None = Field(
        None,
        ge=1,
        description="keep the agents' saved stages (agent_<name>/stage_<k>/) of the newest N "
        "stages only, and any a swap reads; null: every one (HF's save_total_limit, verl's "
        "max_ckpt_to_keep)",
    )
    storage: str | None = Field(
        None,
        description="a URI every node reaches (s3://bucket/prefix, gs://..., file://..., or a "
        "path on shared storage) where the checkpoints, saved stages, saved config, "
        "metrics.jsonl, certificates.jsonl and validation predictions are also written, by "
        "whichever node writes them, and where a resume reads them (on any node); null: the "
        "outputs dir only, on the node of each writer (satseq.storage)",
    )
    trackers: list[TrackerName] = Field(
        default_factory=lambda: ["tensorboard"],
        description="where each stage's metrics.jsonl numbers also go; [] for none",
    )
    mlflow_tracking_uri: str | None = Field(
        None,
        description="an MLflow tracking server (http://host:5000) or store URI; None: a SQLite "
        "store in the run's outputs dir, <output dir>/mlflow/mlflow.db",
    )
    tracker_project: str = Field(
        "satseq", min_length=1, description="the MLflow experiment and the W&B project"
    )

    @field_validator("storage")
    @classmethod
    def _a_storage_uri(cls, uri: str | None) -> str | None:
        from satseq.storage import check_storage_uri  # pyarrow, only when a URI is given

        return None if uri is None else check_storage_uri(uri)

    @field_validator("trackers")
    @classmethod
    def _each_tracker_once(cls, trackers: list[str]) -> list[str]:
        if len(set(trackers)) != len(trackers):
            raise ValueError(f"a tracker is listed twice: {trackers}")
        return trackers


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

    @model_validator(mode="before")
    @classmethod
    def _today_s_spelling(cls, data: Any) -> Any:
        """Keys under the seeds', verl's or an old name read as today's (`config/legacy.py`)."""
        return spell_as_today(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _a_team(self) -> RunConfig:
        if not self.team.agents:
            raise ValueError("team.agents is empty: list at least one {name, path}")
        return self

    @cached_property
    def plan(self) -> TeamPlan:
        """The team's deployment (`config/team_plan.py`), worked out once from this config:
        the checks below, placement, the launch settings, the memory plan and the runtime all
        read it."""
        return TeamPlan.of(self.team, self.trainer, self.rollout)

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> RunConfig:
        """pydantic's copy, whose `plan` is worked out again (from the updated sections)."""
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("plan", None)
        return copied

    def agent_lora(self, i: int) -> LoraConfig | None:
        """Agent i's adapter: its own `lora`, else `trainer.lora`; None: a full model."""
        own = self.team.agents[i].lora
        return None if own is False else (own or self.trainer.lora)

    @model_validator(mode="after")
    def _lora_agents_are_not_sharded_nor_gguf_files(self) -> RunConfig:
        """FSDP2 over a LoRA agent is not built; an adapter needs its base's dequantised
        weights, which a raw GGUF file does not give (`gguf:FILE` imports it)."""
        for i, agent in enumerate(self.team.agents):
            if self.agent_lora(i) is None:
                continue
            lora_key = f"team.agents.{i}.lora" if agent.lora else "trainer.lora"
            workers, key = self.plan.agents[i].workers, self.plan.agents[i].workers_key
            if workers > 1:
                raise ValueError(
                    f"{key}: {workers} with {lora_key} set for agent {agent.name!r}: a LoRA agent "
                    "cannot be sharded over several learner ranks (FSDP2 + LoRA is not built); "
                    f"set {key}: 1, or drop {lora_key}"
                )
            if agent.path.endswith(".gguf") and not agent.path.startswith("gguf:"):
                raise ValueError(
                    f"team.agents.{i}.path: {agent.path!r} is a GGUF file that has not been "
                    f"imported, and {lora_key} needs its base's dequantised weights: give it as "
                    f"'gguf:{agent.path}' (imported once into the model cache)"
                )
        return self

    @model_validator(mode="after")
    def _team_options_fit_the_recipe(self) -> RunConfig:
        """GRPO and SPO give each agent its own prompts, each answered alone: a chain of turns
        and the role prompts of its turns are SAT-Seq's only."""
        if self.algorithm.name == "sat_seq":
            return self
        if self.team.topology != "mixture":
            raise ValueError(
                f"team.topology: {self.team.topology} with algorithm.name: "
                f"{self.algorithm.name}: only sat_seq takes turns in a chain; remove it"
            )
        for i, agent in enumerate(self.team.agents):
            if agent.role_prompt is not None:
                raise ValueError(
                    f"team.agents.{i}.role_prompt is the chain topology's (SAT-Seq), and "
                    f"algorithm.name: {self.algorithm.name} does not read it; remove it"
                )
        return self

    @model_validator(mode="after")
    def _collective_sync_needs_vllm_awake(self) -> RunConfig:
        """A collective weight sync goes into vLLM's weight-transfer API, and into engines that
        are awake: not the hf engine, nor engines that sleep while learners work."""
        if self.plan.weight_sync != "collective":
            return self
        if self.plan.engine != "vllm":
            raise ValueError(
                "rollout.weight_sync: collective needs rollout.engine: vllm (the hf engine "
                "takes weights through the object store: rollout.weight_sync: object_store)"
            )
        if self.plan.engines_share_devices:
            raise ValueError(
                "rollout.weight_sync: collective needs engines that stay awake; with "
                "trainer.offload (or team.agents[i].offload): idle_agents use object_store"
            )
        return self

    @model_validator(mode="after")
    def _overlap_needs_devices_of_their_own(self) -> RunConfig:
        """Overlapped stages run generation and updates at once: engines that sleep while
        the learners work (a shared device) cannot."""
        if self.plan.overlapped and self.plan.engines_share_devices:
            raise ValueError(
                f"rollout.max_staleness: {self.rollout.max_staleness} overlaps generation with "
                "the learners' updates, but trainer.offload (or team.agents[i].offload): "
                "idle_agents shares one device between them (the engines sleep while learners "
                "work); give the engines and learners devices of their own, or set "
                "rollout.max_staleness: 0"
            )
        return self

    @model_validator(mode="after")
    def _dynamic_sampling_needs_groups(self) -> RunConfig:
        if self.rollout.dynamic_sampling.enabled and self.algorithm.name == "spo":
            raise ValueError(
                "rollout.dynamic_sampling.enabled: SPO answers each prompt once, so it has no "
                "groups to find degenerate (its tracker is the baseline): set it to false"
            )
        return self

    @model_validator(mode="after")
    def _behaviour_is_the_full_softmax(self) -> RunConfig:
        """SAT-Seq's IS weights and certificate, and SPO's ratio, take the learner's log-probs of
        the full softmax at the sampling temperature as the behaviour probabilities; nucleus
        sampling draws from another distribution (design §4)."""
        if self.algorithm.name in ("sat_seq", "spo") and self.rollout.top_p < 1.0:
            raise ValueError(
                f"rollout.top_p: {self.rollout.top_p} with algorithm.name: "
                f"{self.algorithm.name}: the learner's behaviour log-probs are of the full "
                "softmax, not the truncated distribution top_p samples from, so every IS weight "
                "and the certificate would be wrong; set rollout.top_p: 1.0 (eval.top_p may "
                "stay below 1)"
            )
        return self

    @model_validator(mode="after")
    def _correction_fits_the_loss(self) -> RunConfig:
        """SAT-Seq's sequence ratio, its IS weights and its baseline weigh whole trajectories:
        its rollout correction is the sequence's."""
        if self.algorithm.name == "sat_seq" and self.rollout.correction.level == "token":
            raise ValueError(
                "rollout.correction.level: token with algorithm.name: sat_seq: SAT-Seq weighs "
                "each trajectory (its sequence ratio, IS weights and baseline), so its rollout "
                "correction is the sequence's; set rollout.correction.level: sequence (or auto)"
            )
        return self

    @model_validator(mode="after")
    def _held_out_check_needs_held_out_prompts(self) -> RunConfig:
        kl_ctrl, certificate = self.algorithm.kl_ctrl, self.algorithm.certificate
        if kl_ctrl.measure_on == "held_out" and certificate.holdout_fraction == 0:
            raise ValueError(
                "algorithm.kl_ctrl.measure_on: held_out measures the KL on the stage's held-out "
                "prompts, but algorithm.certificate.holdout_fraction is 0: hold some out (e.g. "
                "0.25), or set measure_on: train"
            )
        return self
