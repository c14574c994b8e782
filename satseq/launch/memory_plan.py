"""How much device memory a run needs, per learner rank and rollout actor and per phase, from the
models' configs alone: nothing is downloaded and nothing allocated (`satseq plan CONFIG`).

A learner's update, per rank of an agent's W (FSDP2 shards the state over W):

    state          16·P/W   float32 master weights, gradients and AdamW's two moments
    weight casts    2·P     bf16 compute: autocast's copy of every weight, kept for the backward
    activations             what the forward keeps for the backward at a micro-batch's tokens,
                            counted by running the model on fake tensors (`FakeTensorMode`:
                            shapes only); with gradient checkpointing of every k-th layer, the
                            c = ⌈L/k⌉ checkpointed layers' float32 inputs, the other L − c
                            layers' saved tensors, and one layer's again while it is recomputed
    logits          4·m·V·4 a chunk of m = logit_chunk_tokens states: its float32 logits,
                            log-softmax, softmax and gradient (chunked, design §11)
    reference       (V·H + R·H)·4  the exact KL's π_cur: its output layer and its hidden states
                            at the R response states of the agent's batch
    step           4·P/W    foreach AdamW's temporaries, once the activations are freed

    snapshot       12·P/W   the trust region's backtracking snapshot (float32 weights and
                            moments), where it is kept on the device (below)

    peak = state + snapshot + max(casts + activations + logits + reference, step)

A LoRA agent's base sits in the compute dtype (2·P, no casts) and its state is the adapter's;
its activations are the full model's (measured on an H100: within 2 %). The backtracking
snapshot is kept on the device where a configured micro-batch (micro_batch_size longest
trajectories) still fits beside it at the chosen stride (`specs.snapshot_on_device`, as the
learner decides it on its own device), otherwise in host memory; an offloaded agent's state
lives in host memory. A vLLM engine on a GPU takes
`rollout.gpu_memory_utilization` of it and must hold the bf16 weights. The constants were
checked against the peaks measured on an H100 (bench/results/gpu_sheet_h100.json,
tests/test_memory_plan.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any

from satseq.actors.learner.specs import (
    CheckpointChoices,
    TokenBudget,
    snapshot_bytes,
    snapshot_on_device,
)
from satseq.config import RunConfig

GIB = 1024**3
USABLE = 0.9
"""The share of a device a phase may plan to fill: the CUDA context and the caching allocator's
fragmentation take the rest (the 4B exact update, predicted at 73.6 GiB, ran out of memory on an
80 GB H100)."""
PROMPT_TOKENS = 512
"""The prompt length a plan assumes where it is not told one (`satseq plan --prompt-tokens`)."""
# float32 [chunk, V] buffers: the fused output layer holds 2 at once, 3 with the exact KL
# (measured: tests/algo/test_lm_head.py), and on tensor cores a bf16 copy of the gradient; 4 is
# what the H100 sheet's peaks were fitted with (the layer before it), an upper bound until a GPU
# measures the fused layer
LOGIT_BUFFERS = 4
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    # the seeds' agents, so that a plan needs no download: Qwen/Qwen3-4B's config.json, shapes
    "Qwen/Qwen3-4B": dict(
        model_type="qwen3",
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    ),
}


@dataclass(frozen=True)
class Phase:
    """One device's memory in one phase: what it holds (GiB each) against what it has."""

    who: str  # "learner a0 (rank 1 of 2)", "rollout actor 0"
    phase: str  # update, rollout
    parts: dict[str, float] = field(default_factory=dict)
    budget_gib: float = math.inf

    @property
    def peak_gib(self) -> float:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.peak_gib <= USABLE * self.budget_gib


def model_config(path: str):
    """The transformers config of the model at `path` (a local or builtin model, a Hub model in
    the local cache, or one of KNOWN_CONFIGS), read without downloading anything."""
    from transformers import AutoConfig

    from satseq.models import ModelLoadError, resolve_model_path
    from satseq.models.adapters import adapter_base

    if path in KNOWN_CONFIGS:
        known = dict(KNOWN_CONFIGS[path])
        return AutoConfig.for_model(known.pop("model_type"), **known)
    try:
        directory = resolve_model_path(path)
    except ModelLoadError as error:
        raise ValueError(
            f"{path}: its config is needed and could not be read ({error}); give a local "
            "directory or a Hub model in the local cache"
        ) from None
    from satseq.models import is_adapter_dir

    return AutoConfig.from_pretrained(
        adapter_base(directory) if is_adapter_dir(directory) else directory
    )


def saved_bytes(config, tokens: int, compute_dtype: str) -> tuple[int, int]:
    """(parameters, bytes the forward of `config`'s model keeps for the backward at `tokens`
    tokens, its weights aside), counted on fake tensors (shapes only: nothing allocated); each
    storage once, however many views of it are kept."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, compute_dtype)
    storages: dict[int, int] = {}

    def keep(tensor):
        storage = tensor.untyped_storage()
        storages[storage._cdata] = storage.nbytes()
        return tensor

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        weights = {p.untyped_storage()._cdata for p in model.parameters()}
        ids = torch.zeros(1, tokens, dtype=torch.long)  # fake, on the CPU: only sizes count
        autocast = torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32)
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), autocast:
            model.model(input_ids=ids)
        parameters = sum(p.numel() for p in model.parameters())
    return parameters, sum(n for key, n in storages.items() if key not in weights)


@functools.lru_cache(maxsize=32)
def _activation_profile(config_json: str, compute_dtype: str) -> tuple[int, float]:
    from transformers import AutoConfig

    data = json.loads(config_json)
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    parameters, small = saved_bytes(config, 128, compute_dtype)
    _, large = saved_bytes(config, 256, compute_dtype)
    return parameters, (large - small) / 128  # the weights' casts do not grow with the tokens


def activation_profile(config, compute_dtype: str) -> tuple[int, float]:
    """(parameter count, activation bytes saved per token) of `config`'s model, from two fake
    forwards (128 and 256 tokens; cached per config)."""
    return _activation_profile(config.to_json_string(use_diff=False), compute_dtype)


@dataclass(frozen=True)
class Workload:
    """The shapes a learner's update runs at: trajectories a micro-batch, tokens of a prompt
    and of a response, and the agent's trajectories a stage (its exact-KL reference)."""

    micro_batch: int
    prompt_tokens: int
    response_tokens: int
    trajectories: int
    max_tokens: int | None = None

    @property
    def tokens(self) -> int:
        """A micro-batch's tokens: its trajectories', within `max_tokens` (one trajectory at
        least)."""
        length = self.prompt_tokens + self.response_tokens
        tokens = self.micro_batch * length
        return tokens if self.max_tokens is None else max(min(tokens, self.max_tokens), length)


@dataclass(frozen=True)
class LearnerUpdate:
    """One learner rank's update: its model's config, compute dtype and shapes, its share of
    the agent's W ranks, whether it keeps the exact KL's reference, which of its layers it
    checkpoints (every k-th; None: none), and whether it trains an adapter (of
    `lora_parameters`) rather than every weight."""

    config: Any
    compute_dtype: str
    workload: Workload
    exact_kl: bool
    checkpoint_every: int | None
    chunk_tokens: int
    workers: int = 1
    lora_parameters: int | None = None
    snapshot_on_device: bool = False

    def peak(self) -> dict[str, float]:
        """The update's peak, by part (GiB): see the module's docstring."""
        (state, casts, *rest), per_token, step = self._terms()
        parts = dict([state, casts, ("activations", self.workload.tokens * per_token), *rest])
        forward = sum(value for key, value in parts.items() if key != "state")
        if step > forward:  # the optimiser step's temporaries outgrow the forward's
            parts = {"state": parts["state"], "optimiser step": step}
        if self.snapshot_on_device:
            parts["snapshot"] = self.snapshot_bytes
        return {key: value / GIB for key, value in parts.items()}

    @property
    def snapshot_bytes(self) -> float:
        """The backtracking snapshot of this rank (bytes)."""
        trained = self.lora_parameters
        if trained is None:
            trained = activation_profile(self.config, self.compute_dtype)[0]
        return snapshot_bytes(trained, self.workers)

    def token_budget(self, share: float = 1.0) -> TokenBudget:
        """The micro-batch token budget of this update on `share` of a device."""
        fixed, per_token, step = self._terms()
        total = sum(value for _, value in fixed)
        return TokenBudget(total, fixed[0][1], step, per_token, share, USABLE, self.workload.tokens)

    def _terms(self) -> tuple[list[tuple[str, float]], float, float]:
        """The parts that do not grow with a micro-batch's tokens, state first (bytes); the
        activations' bytes a token; the optimiser step's temporaries (bytes)."""
        config, workload = self.config, self.workload
        P, per_token = activation_profile(config, self.compute_dtype)
        H, V, layers = config.hidden_size, config.vocab_size, config.num_hidden_layers
        if self.checkpoint_every is not None:
            c = math.ceil(layers / self.checkpoint_every)  # the checkpointed layers
            per_token = c * H * 4 + (layers - c + 1) * per_token / layers
        lora = self.lora_parameters is not None
        trained = self.lora_parameters if lora else P
        casts = 2 * P if (self.compute_dtype != "float32" or lora) else 0
        fixed = [
            ("state", 16 * trained / self.workers),
            ("weights (compute dtype)" if lora else "weight casts", casts),
            ("logits", LOGIT_BUFFERS * self.chunk_tokens * V * 4),
        ]
        if self.exact_kl:
            reference = (V + workload.trajectories * workload.response_tokens) * H * 4
            fixed.append(("exact-KL reference", reference))
        return fixed, per_token, 4 * trained / self.workers


def strides(layers: int) -> list[int | None]:
    """The checkpointing strides `gradient_checkpointing: auto` considers, fewest recomputed
    layers first: none, then for each count c of checkpointed layers the most even stride k with
    ⌈L/k⌉ = c, down to every layer (k = 1)."""
    by_count: dict[int, int] = {}
    for k in range(1, layers + 1):
        by_count.setdefault(math.ceil(layers / k), k)
    return [None, *(by_count[c] for c in sorted(by_count))]


def checkpoint_choices(update: LearnerUpdate, share: float) -> CheckpointChoices:
    """`gradient_checkpointing: auto`: the update's token budget on `share` of a device at each
    stride, and the tokens one micro-batch of its workload needs."""
    budgets = tuple(
        (every, dataclasses.replace(update, checkpoint_every=every).token_budget(share))
        for every in strides(update.config.num_hidden_layers)
    )
    return CheckpointChoices(budgets, update.workload.tokens)


def stride_name(every: int | None) -> str:
    if every is None:
        return "no layer checkpointed"
    return "every layer checkpointed" if every == 1 else f"one layer in {every} checkpointed"


def lora_parameter_count(config, rank: int) -> int:
    """The adapter's parameters: rank·(in + out) for every linear layer of every block."""
    H, intermediate = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or H // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    q = config.num_attention_heads * head_dim
    per_layer = (H + q) + 2 * (H + kv) + (q + H) + 2 * (H + intermediate) + (intermediate + H)
    return rank * per_layer * config.num_hidden_layers


def agent_update(
    run: RunConfig, i: int, prompt_tokens: int = 0, path: str | None = None
) -> LearnerUpdate:
    """Agent i's update on one of its learner ranks, at the config's shapes and prompts of
    `prompt_tokens` (an int `trainer.max_tokens_per_micro_batch` bounds its micro-batches), for
    the model at `path` (None: the configured one). Its token budget reads no prompt length."""
    trainer = run.trainer
    compute = trainer.dtype if trainer.dtype != "auto" else "bfloat16"
    G = run.grpo.group_size if run.algorithm.name == "grpo" else run.sat_seq.group_size
    n = len(run.team.agents)
    per_agent = trainer.batch_size * (G if run.algorithm.name != "sat_seq" else max(G // n, 1))
    cap = trainer.max_tokens_per_micro_batch
    workload = Workload(
        trainer.micro_batch_size, prompt_tokens, run.rollout.max_new_tokens, per_agent,
        max_tokens=cap if isinstance(cap, int) else None,
    )  # fmt: skip
    config, lora = model_config(path or run.team.agents[i].path), run.agent_lora(i)
    return LearnerUpdate(
        config, compute, workload, workers=run.plan.agents[i].workers,
        exact_kl=run.algorithm.name == "sat_seq" and run.algorithm.kl_ctrl.estimator == "exact",
        checkpoint_every=trainer.checkpoint_every, chunk_tokens=trainer.logit_chunk_tokens,
        lora_parameters=None if lora is None else lora_parameter_count(config, lora.rank),
    )  # fmt: skip


def plan(run: RunConfig, gpu_gib: float, prompt_tokens: int) -> list[Phase]:
    """Every learner rank's update and every rollout actor's generation, against the GPU share
    its placement bundle has (`trainer.resources`, `rollout.resources`; host memory where it has
    no GPU: no budget). With `trainer.max_tokens_per_micro_batch: auto` a learner's
    micro-batches are as large as its GPU share holds (`TokenBudget`), with
    `trainer.gradient_checkpointing: auto` it checkpoints the fewest layers at which a configured
    micro-batch fits (`CheckpointChoices`), under the trust region its backtracking snapshot is
    kept on the device where a configured micro-batch fits beside it (`snapshot_on_device`),
    and its phase says so."""
    rollout = run.rollout
    phases, engines = [], {}
    for i, agent in enumerate(run.team.agents):
        phase, update = learner_phase(run, i, gpu_gib, prompt_tokens)
        phases.append(phase)
        lora = run.agent_lora(i) is not None
        engines.setdefault(agent.path if lora else agent.name, update)
    if run.plan.vllm_on_gpus:  # each engine its share
        engine_gib = rollout.gpu_memory_utilization * gpu_gib
        held = {f"engine {key}": engine_gib for key in engines}
        actor_gib = rollout.resources.num_gpus * gpu_gib
        for j in range(rollout.num_actors):
            phases.append(Phase(f"rollout actor {j}", "rollout", held, actor_gib))
        for key, update in engines.items():
            parameters = activation_profile(update.config, update.compute_dtype)[0]
            weights = {"bf16 weights": 2 * parameters / GIB}
            phases.append(Phase(f"engine {key}", "rollout (in its share)", weights, engine_gib))
    return phases


def learner_phase(
    run: RunConfig, i: int, gpu_gib: float, prompt_tokens: int
) -> tuple[Phase, LearnerUpdate]:
    """Agent i's update on one of its learner ranks, as its learner runs it on a GPU of
    `gpu_gib` (see `plan`), and that update."""
    trainer = run.trainer
    share, device_bytes = trainer.resources.num_gpus, gpu_gib * GIB
    update, chosen = agent_update(run, i, prompt_tokens), []
    at_stride = update.token_budget(share)  # the micro-batch budget at the stride it runs
    if trainer.gradient_checkpointing == "auto" and share:
        every, at_stride = checkpoint_choices(update, share).choose(device_bytes)
        update = dataclasses.replace(update, checkpoint_every=every)
        chosen.append(stride_name(every))
    reserved = 0.0  # the snapshot's bytes on the device
    # under the trust region, and never on a device the learner lends between its updates
    backtracks = run.algorithm.name == "sat_seq" and not run.plan.agents[i].shares_devices
    if backtracks and share and snapshot_on_device(at_stride, update.snapshot_bytes, device_bytes):
        update = dataclasses.replace(update, snapshot_on_device=True)
        reserved = update.snapshot_bytes
        chosen.append("snapshot on the device")
    if trainer.max_tokens_per_micro_batch == "auto" and share:
        tokens = at_stride.tokens(device_bytes, reserved)
        workload = dataclasses.replace(update.workload, max_tokens=tokens)
        update = dataclasses.replace(update, workload=workload)
        chosen.append(
            f"micro-batches of at most {tokens:,} tokens"
            if tokens
            else "no micro-batch fits beside the rest"
        )
    phase = f"update ({'; '.join(chosen)})" if chosen else "update"
    workers = run.plan.agents[i].workers
    who = f"learner {run.team.agents[i].name}" + (
        f" (each of {workers} ranks)" if workers > 1 else ""
    )
    return Phase(who, phase, update.peak(), share * gpu_gib or math.inf), update
