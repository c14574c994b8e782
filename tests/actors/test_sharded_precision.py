"""A sharded agent (FSDP2) gathers its decoder layers in the compute dtype: each rank casts its
own shard once a gather, where a float32 gather left autocast to cast the whole gathered layer
again in every micro-batch, and half the bytes cross the wire. The masters, their gradients and
the output layer stay float32, and the residual stream stays float32 as an unsharded agent's
does under autocast. In process, on a one-rank gloo group (the two-rank group on Ray is
tests/actors/test_sharded_learner.py)."""

import copy

import pytest
import torch
import torch.distributed as dist

from satseq.actors.forward import PolicyTrunk
from satseq.actors.sharding import shard_policy
from satseq.models import load_policy

PROMPTS = ["What is 12 plus 30?", "Add 7 and 5, then double it."]


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def trunks(path: str, compute_dtype: torch.dtype) -> tuple[PolicyTrunk, PolicyTrunk, dict]:
    """The tiny model's trunk sharded, the same trunk unsharded, and a padded batch."""
    model, tokenizer = load_policy(path, dtype="float32")
    plain = PolicyTrunk(copy.deepcopy(model))
    sharded = shard_policy(PolicyTrunk(model), 1, torch.device("cpu"), False, compute_dtype)
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    return sharded, plain, dict(batch)


def forward_and_backward(trunk: PolicyTrunk, batch: dict, compute_dtype: torch.dtype):
    """Hidden states and output layer weight of one forward under autocast, then a backward;
    with the dtypes of the weights each decoder layer's Linear modules computed with."""
    seen: dict[int, set] = {}

    def record(index):
        def hook(module, args):
            seen.setdefault(index, set()).add(module.weight.dtype)

        return hook

    hooks = [
        linear.register_forward_pre_hook(record(index))
        for index, layer in enumerate(trunk.model.base_model.layers)
        for linear in layer.modules()
        if isinstance(linear, torch.nn.Linear)
    ]
    with torch.autocast("cpu", dtype=compute_dtype, enabled=compute_dtype != torch.float32):
        hidden, weight, _ = trunk(batch["input_ids"], batch["attention_mask"])
        (hidden.float().square().mean() + weight.float().square().mean()).backward()
    for handle in hooks:
        handle.remove()
    return hidden.detach().float(), weight.dtype, seen


def test_layers_are_gathered_in_the_compute_dtype_and_the_rest_stays_float32(
    raw_tiny_model, one_rank_group
):
    sharded, plain, batch = trunks(raw_tiny_model, torch.bfloat16)
    hidden, head_dtype, seen = forward_and_backward(sharded, batch, torch.bfloat16)
    assert len(seen) == len(sharded.model.base_model.layers)
    assert all(dtypes == {torch.bfloat16} for dtypes in seen.values()), seen
    assert head_dtype == torch.float32  # the output layer's float32 logits need it
    for name, param in sharded.named_parameters():
        assert param.dtype == torch.float32 and param.grad.dtype == torch.float32, name

    unsharded, _, plain_seen = forward_and_backward(plain, batch, torch.bfloat16)
    assert all(dtypes == {torch.float32} for dtypes in plain_seen.values())  # autocast casts
    exact, _, _ = forward_and_backward(plain, batch, torch.float32)
    # as accurate as the unsharded agent under autocast (measured: 1.00 times its error; with
    # the residual stream cast to bf16 at each layer, FSDP2's default, 1.47 times)
    assert rms_error(hidden, exact) < 1.15 * rms_error(unsharded, exact)


def rms_error(value: torch.Tensor, exact: torch.Tensor) -> float:
    return float((value - exact).square().mean().sqrt() / exact.square().mean().sqrt())


def test_a_float32_agent_is_sharded_as_it_was(raw_tiny_model, one_rank_group):
    sharded, plain, batch = trunks(raw_tiny_model, torch.float32)
    hidden, head_dtype, seen = forward_and_backward(sharded, batch, torch.float32)
    assert all(dtypes == {torch.float32} for dtypes in seen.values())
    expected, _, _ = forward_and_backward(plain, batch, torch.float32)
    assert head_dtype == torch.float32 and torch.allclose(hidden, expected, atol=1e-6)
