"""An agent's model and optimiser on the learner's device, and the forward passes over a batch.

Precision: the master weights and the optimiser state are float32; forward and backward run
under autocast in `LearnerSpec.dtype` (bfloat16 on GPUs), so an update of 1e-6 relative size is
kept rather than rounded away. Memory: logits exist one chunk of tokens at a time
(`satseq.algo.lm_head`). With `offload="idle_agents"` the master weights and AdamW state live in
host memory between updates (`satseq.actors.residency`). Sharded (W > 1), the model is sharded
with FSDP2 and the ranks split each batch's micro-batches between them
(`satseq.actors.sharding`).

A LoRA agent (`model_path` a PEFT adapter directory, design §12) holds its base frozen in the
compute dtype, with no gradients, optimiser state, snapshot or offload, and trains the float32
adapter only: every one of those covers `trainable_parameters()`. `model` is then the base
model with the adapter's layers in it (peft adapts the modules in place), so every forward
pass reads it as it reads a full model; `adapter` is the peft model that saves it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import torch

from satseq.actors.forward import PolicyTrunk
from satseq.actors.learner.snapshot import TrainingSnapshot
from satseq.actors.learner.specs import LearnerSpec, snapshot_bytes, snapshot_on_device
from satseq.actors.packing import packable
from satseq.actors.residency import Residency
from satseq.actors.sharding import ShardGroup, shard_policy
from satseq.actors.trajectory import PaddedBatch, Trajectory, pad_batch
from satseq.models import is_adapter_dir, load_policy
from satseq.models.adapters import adapter_config, load_adapted_policy
from satseq.models.loading import TORCH_DTYPES, checkpoint_layers

log = logging.getLogger(__name__)


class AgentPolicy:
    """The agent's model (`trunk`: what every forward pass calls), its AdamW, where they live
    (`residency`), its rank's place in the agent's shard group, and the backtracking snapshot's
    CPU buffers (reused by every step)."""

    def __init__(self, spec: LearnerSpec):
        self.spec = spec
        torch.set_num_threads(spec.num_threads)
        torch.manual_seed(spec.seed)
        self.compute_dtype = TORCH_DTYPES[spec.dtype]
        # π_cur's frozen states for the exact KL: float32 with a float32 head, so that π_cur's
        # logits are computed as π_θ's are
        self.reference_dtype = torch.float32 if spec.fp32_head else self.compute_dtype
        self.save_dtype = TORCH_DTYPES[spec.save_dtype or spec.dtype]
        self.group = ShardGroup(spec.rank, spec.workers)
        self.adapter = None  # a LoRA agent's peft model
        self.lora: dict | None = None  # and its adapter's config (rank, alpha, layers)
        if is_adapter_dir(spec.model_path):
            self.adapter, self.tokenizer = load_adapted_policy(
                spec.model_path, spec.dtype, spec.device, trainable=True
            )
            self.model = self.adapter.base_model.model
            self.lora = adapter_config(spec.model_path)
        else:
            self.model, self.tokenizer = load_policy(
                spec.model_path, dtype="float32", device=spec.device
            )
        self.device = next(self.model.parameters()).device
        self.checkpoint_every, self.max_tokens, device_snapshot = self._memory_settings(spec)
        if self.checkpoint_every is not None:
            checkpoint_layers(self.model, self.checkpoint_every)
        self.model.train()
        self.trunk = PolicyTrunk(self.model, spec.fp32_head)
        if self.group.sharded:
            offload = spec.offload == "idle_agents"
            shard_policy(self.trunk, spec.workers, self.device, offload, self.compute_dtype)
        self.optimizer = torch.optim.AdamW(
            self.trainable_parameters(),
            lr=spec.optimizer.lr,
            weight_decay=spec.optimizer.weight_decay,
            fused=(self.device.type == "cuda" and not self.group.sharded) or None,  # one kernel
        )
        self.snapshot = TrainingSnapshot(on_device=device_snapshot)
        self.pad_token_id = self.tokenizer.pad_token_id
        self.residency = Residency(  # sharded, FSDP2 offloads instead
            self.model,
            self.optimizer,
            self.compute_dtype,
            spec.offload == "idle_agents" and not self.group.sharded,
        )

    def _memory_settings(self, spec: LearnerSpec) -> tuple[int | None, int | None, bool]:
        """The checkpointed layers' stride (None: none), a micro-batch's most tokens (None: no
        cap) and whether the backtracking snapshot is kept on the device: the spec's (and host
        memory), or on a GPU what its memory plan gives this device (`snapshot_on_device`)."""
        every, budget, at_stride = spec.checkpoint_every, spec.token_budget, spec.snapshot_budget
        if self.device.type != "cuda":
            return every, spec.max_tokens_per_micro_batch, False
        device_bytes = torch.cuda.get_device_properties(self.device).total_memory
        if spec.checkpoint_choices is not None:
            every, at_stride = spec.checkpoint_choices.choose(device_bytes)
            budget = at_stride if budget is not None else None
        snapshot = 0.0  # the bytes the snapshot takes on the device
        if spec.trust_region.enabled and spec.offload == "none":  # offload: the device is lent
            trained = sum(param.numel() for param in self.model.parameters() if param.requires_grad)
            snapshot = snapshot_bytes(trained, spec.workers)
            if not snapshot_on_device(at_stride, snapshot, device_bytes):
                snapshot = 0.0
        if budget is None:
            return every, spec.max_tokens_per_micro_batch, snapshot > 0
        tokens = budget.tokens(device_bytes, reserved=snapshot)
        if not tokens:
            log.warning("the memory plan leaves no room for activations: one trajectory a pass")
        return every, tokens, snapshot > 0

    def share_base(self, other: AgentPolicy) -> bool:
        """This LoRA agent's frozen base weights become `other`'s where `other` is a LoRA agent
        on the same base, device and dtype: one copy of the base for the two (the agents of one
        learner host). Whether they now share it."""
        if self.lora is None or other.lora is None:
            return False
        if self.lora["base_model_name_or_path"] != other.lora["base_model_name_or_path"]:
            return False
        theirs = _frozen(other.model)
        pairs = [(param, theirs.get(name)) for name, param in _frozen(self.model).items()]
        if not all(
            base is not None
            and (base.shape, base.dtype, base.device) == (param.shape, param.dtype, param.device)
            for param, base in pairs
        ):
            return False
        for param, base in pairs:
            param.data = base.data  # frozen: neither is ever written
        return True

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimiser steps: every weight of a full model, a LoRA agent's adapter."""
        return [param for param in self.trunk.parameters() if param.requires_grad]

    def autocast(self) -> contextlib.AbstractContextManager:
        """Forward passes in the compute dtype over the float32 master weights."""
        return torch.autocast(
            self.device.type,
            dtype=self.compute_dtype,
            enabled=self.compute_dtype != torch.float32,
        )

    def cast_once(self) -> contextlib.AbstractContextManager:
        """Around a pass over several micro-batches whose weights do not change: autocast
        casts each weight to the compute dtype once, and every micro-batch's forward (and, on
        this thread, a checkpointed recompute) reuses that cast, where each `autocast()` alone
        would cast again (torch drops its casts when the outermost autocast context exits).
        It is itself a disabled autocast context, so what runs between the forwards (the
        backward passes) runs as without it. Sharded, it does nothing: the casts kept would be
        the whole model's, not this rank's shards."""
        if self.compute_dtype == torch.float32 or self.group.sharded:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, enabled=False)

    def micro_batches(
        self, trajectories: list[Trajectory], rows: list[int] | None = None
    ) -> Iterator[tuple[list[int], PaddedBatch]]:
        """The trajectories `rows` (default: all, in order) in consecutive micro-batches of at
        most `micro_batch_size` trajectories and `max_tokens` tokens (`micro_batch_parts`), on
        the CPU; each with its rows."""
        rows = list(range(len(trajectories))) if rows is None else rows
        lengths = [
            len(trajectories[r].prompt_ids) + len(trajectories[r].response_ids) for r in rows
        ]
        padded = not packable(self.trunk.model.config)
        for part in micro_batch_parts(lengths, self.spec.micro_batch_size, self.max_tokens, padded):
            chosen = rows[part.start : part.stop]
            yield chosen, pad_batch([trajectories[row] for row in chosen], self.pad_token_id)

    def device_batches(self, trajectories: list[Trajectory]) -> list[PaddedBatch]:
        """Every micro-batch of `trajectories`, on the device."""
        return [batch.to(self.device) for _, batch in self.micro_batches(trajectories)]

    @torch.no_grad()
    def per_token(
        self, trajectories: list[Trajectory], compute: Callable[[PaddedBatch], torch.Tensor]
    ) -> torch.Tensor:
        """compute(micro-batch) [n, T_mb] gathered into [N, T] (T = longest response), on CPU;
        sharded, each rank computes its share of the micro-batches."""
        T = max(len(t.response_ids) for t in trajectories)
        out = torch.zeros(len(trajectories), max(T, 1), device="cpu")
        computed = []
        with self.cast_once():
            for (rows, batch), real in self.group.mine(list(self.micro_batches(trajectories))):
                with self.autocast():
                    values = compute(batch.to(self.device))
                if real:
                    computed.append((rows, values.float().cpu()))
        for rows, values in (part for parts in self.group.gather(computed) for part in parts):
            out[rows, : values.shape[1]] = values
        return out

    def reshard(self) -> None:
        """Sharded: drop the gathered copy of the root's weights (embeddings, norm, output
        layer), which FSDP2 keeps after a forward without backward, so that the parameters are
        the shards again (what snapshots, checkpoints and restores read and write); the next
        forward gathers them afresh."""
        if self.group.sharded:
            self.trunk.reshard()

    def save_snapshot(self) -> TrainingSnapshot:
        """The weights and optimiser state now, into the snapshot's CPU buffers."""
        self.reshard()
        return self.snapshot.save(self.model, self.optimizer)

    def restore(self, snapshot: TrainingSnapshot) -> None:
        """Back to the weights and optimiser state of `snapshot` (a backtrack)."""
        self.reshard()
        snapshot.restore(self.model, self.optimizer)


def _frozen(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """A LoRA model's base weights by their base's names, whether or not peft wrapped their layer
    (`q_proj.base_layer.weight` where the adapter targets q_proj, `q_proj.weight` where not)."""
    return {
        name.replace(".base_layer.", "."): param
        for name, param in model.named_parameters()
        if not param.requires_grad
    }


def micro_batch_parts(
    lengths: list[int], max_rows: int, max_tokens: int | None, padded: bool
) -> list[range]:
    """Trajectories of `lengths` (prompt + response tokens) in consecutive parts, each as long
    as it may be: at most `max_rows` and, if set, `max_tokens` tokens (the sum of its lengths,
    as packed rows hold them; `padded`: its count times its longest, as padded rows do); a
    trajectory over `max_tokens` goes alone."""
    parts, start = [], 0
    while start < len(lengths):
        end, total, longest = start + 1, lengths[start], lengths[start]
        while end < len(lengths) and end - start < max_rows:
            total, longest = total + lengths[end], max(longest, lengths[end])
            tokens = (end - start + 1) * longest if padded else total
            if max_tokens is not None and tokens > max_tokens:
                break
            end += 1
        parts.append(range(start, end))
        start = end
    return parts
