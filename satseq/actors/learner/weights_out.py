"""A learner's weights on their way out: to the rollout engines (in buckets through the object
store, or broadcast over a weight-transfer group) and to HF directories. A LoRA agent's weights
are its adapter's, named as in PEFT's files (what its engines load and `satseq eval` reads), and
its saved directory is an adapter directory (design §12)."""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Iterator

import torch

from satseq.actors.learner.policy import AgentPolicy
from satseq.actors.learner.snapshot import local_shard
from satseq.actors.sharding import full_state
from satseq.actors.tensor_bucket import TensorBucket
from satseq.actors.weight_transfer import TensorSpec, WeightSender
from satseq.files import write_directory_atomically
from satseq.models.adapters import ADAPTER_NAME, write_adapter


def adapter_state(policy: AgentPolicy) -> dict[str, torch.Tensor]:
    """A LoRA agent's adapter tensors, PEFT-named as in `adapter_model.safetensors`: peft's
    parameter names less the adapter's name, what `peft.get_peft_model_state_dict` returns
    (which also walks the whole model's state dict: 8x the time of this)."""
    return {
        name.replace(f".{ADAPTER_NAME}.", "."): param.detach()
        for name, param in policy.adapter.named_parameters()
        if param.requires_grad
    }


def weights_to_send(
    policy: AgentPolicy, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, weight in the save dtype on `device`), one gathered at a time (sharded: every
    rank takes part in each gather); a LoRA agent's adapter tensors."""
    policy.reshard()
    named = adapter_state(policy).items() if policy.lora is not None else full_state(policy.model)
    for name, tensor in named:
        yield name, tensor.detach().to(device, policy.save_dtype, copy=True)


def weight_buckets(policy: AgentPolicy, bucket_mb: float) -> Iterator[TensorBucket]:
    """The current weights as CPU tensors in the save dtype, named as in the HF model (what
    rollout engines load), in buckets of about `bucket_mb` MiB (`TensorBucket`s: the object
    store moves them as raw buffers): one tensor gathered at a time, never the whole model at
    once. A decoder layer's tensors share a bucket (an engine that fuses them, vLLM,
    reprocesses a layer once it has all of it), so a bucket can pass `bucket_mb` by at most a
    layer. Sharded, rank 0 yields them; the other ranks take part in the gathers and yield
    nothing. A LoRA adapter goes in one bucket, whatever its size: an engine installs an
    adapter whole, as a new version (a bucket each would be a version each).
    """
    limit = float("inf") if policy.lora is not None else bucket_mb * 2**20
    bucket = TensorBucket()
    size, unit = 0, None
    for name, tensor in weights_to_send(policy, torch.device("cpu")):
        if policy.group.rank != 0:
            continue
        if bucket and size + tensor.nbytes > limit and layer_of(name) != unit:
            yield bucket
            bucket, size = TensorBucket(), 0
        bucket[name] = tensor
        size += tensor.nbytes
        unit = layer_of(name)
    if bucket:
        yield bucket


def layer_of(name: str) -> str:
    """The decoder layer a weight belongs to ("model.layers.3"), or the weight's own name."""
    match = re.match(r"(.*\.layers\.\d+)\.", name)
    return match.group(1) if match else name


def weight_manifest(policy: AgentPolicy) -> list[TensorSpec]:
    """What `send_weights` sends, in order (the engines allocate from it)."""
    dtype = str(policy.save_dtype).removeprefix("torch.")
    named = adapter_state(policy) if policy.lora is not None else policy.model.state_dict()
    return [
        TensorSpec(name, dtype, tuple(tensor.shape))  # a shard's shape is the whole one
        for name, tensor in named.items()
    ]


def send_weights(
    policy: AgentPolicy, sender: WeightSender | None, manifest: list[TensorSpec]
) -> float:
    """Broadcast the current weights over `sender`'s group (the engines receive with
    `VLLMEngine.receive_weights`); the seconds it took. A failed send closes the group (its
    closed sockets release the waiting engines)."""
    started = time.perf_counter()
    if policy.group.rank > 0:  # its part of each gather, nothing to send
        for _ in weights_to_send(policy, policy.device):
            pass
    elif sender is None:
        raise RuntimeError("no weight-transfer group: call open_weight_transfer first")
    else:
        on_device = sender.endpoint.backend == "nccl"
        sent = weights_to_send(policy, policy.device if on_device else torch.device("cpu"))
        try:
            sender.send(manifest, sent)
        except Exception:
            sender.close()
            raise
    return time.perf_counter() - started


def all_weights(policy: AgentPolicy) -> dict[str, torch.Tensor]:
    """Every weight in one dict (`weight_buckets` merged)."""
    buckets = weight_buckets(policy, float("inf"))
    return {name: tensor for bucket in buckets for name, tensor in bucket.items()}


def save_pretrained(policy: AgentPolicy, directory: str) -> str:
    """An HF directory (weights in the save dtype + tokenizer) loadable by transformers and
    vLLM; sharded, consolidated from the shards and written by rank 0. A LoRA agent's: an
    adapter directory (PEFT's files, the tokenizer) that peft and vLLM load on its base."""
    weights = all_weights(policy)
    if policy.group.rank == 0:  # written aside, then renamed: never a half directory
        write_directory_atomically(directory, lambda path: _write_hf(policy, weights, str(path)))
    return directory


def _write_hf(policy: AgentPolicy, weights: dict[str, torch.Tensor], directory: str) -> None:
    if policy.lora is not None:
        write_adapter(directory, policy.lora, weights)
        policy.tokenizer.save_pretrained(directory)
        return
    seen = set()
    for name, tensor in policy.model.state_dict().items():  # tied weights are saved once
        if local_shard(tensor).data_ptr() in seen:
            del weights[name]
        seen.add(local_shard(tensor).data_ptr())
    policy.model.save_pretrained(directory, state_dict=weights)
    config = copy.deepcopy(policy.model.config)
    config.dtype = policy.save_dtype  # save_pretrained wrote the master weights' float32
    config.save_pretrained(directory)
    policy.tokenizer.save_pretrained(directory)
