"""Rows that share a prompt run packed, the prompt computed once (`satseq.actors.prompt_packing`):
every response state and every gradient is the one the rows compute alone, for each
architecture that packs; rows are packed only where that saves compute."""

import dataclasses

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from satseq.actors.forward import PolicyTrunk, response_hidden_states, response_positions
from satseq.actors.prompt_packing import PACKABLE_MODELS, pack_shared_prompts
from satseq.actors.trajectory import Trajectory, pad_batch

SHAPE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
)
ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}


def model(kind: str):
    config_class, model_class = ARCHITECTURES[kind]
    torch.manual_seed(0)
    return model_class(config_class(**SHAPE)).train()


def two_groups(prompt_len: int = 20, lengths=(3, 5, 4, 2, 6)):
    """Five trajectories on two prompts, interleaved, responses of different lengths."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 100, (n,), generator=g).tolist() for n in (prompt_len, 17)]
    return [
        Trajectory(k % 2, prompts[k % 2], torch.randint(1, 100, (R,), generator=g).tolist(),
                   [1] * R, [0] * R, "stop")
        for k, R in enumerate(lengths)
    ]  # fmt: skip


def states_row_by_row(trunk, trajectories):
    """Each trajectory alone: the reference a packed pass must reproduce, [N, T, H]."""
    T = max(len(t.response_ids) for t in trajectories)
    rows = []
    for t in trajectories:
        states, _ = response_hidden_states(trunk, pad_batch([t], 0))
        rows.append(torch.nn.functional.pad(states, (0, 0, 0, T - states.shape[1])))
    return torch.cat(rows)


def test_every_packable_architecture_is_checked_here():
    assert set(ARCHITECTURES) == PACKABLE_MODELS


@pytest.mark.parametrize("kind", sorted(ARCHITECTURES))
def test_packed_states_and_gradients_are_the_rows_own(kind):
    policy = model(kind)
    trunk = PolicyTrunk(policy)
    trajectories = two_groups()
    batch = pad_batch(trajectories, 0)
    assert pack_shared_prompts(batch, policy.config) is not None
    where = response_positions(batch)
    weights = torch.randn(*where.shape, SHAPE["hidden_size"]) * where.unsqueeze(-1)

    packed, _ = response_hidden_states(trunk, batch)
    (packed * weights).sum().backward()
    trained = [p for p in policy.parameters() if p.grad is not None]  # not an untied head
    packed_grads = [p.grad.clone() for p in trained]
    policy.zero_grad()
    alone = states_row_by_row(trunk, trajectories)
    (alone * weights).sum().backward()

    assert (packed - alone)[where].abs().max() < 1e-5
    for packed_grad, p in zip(packed_grads, trained, strict=True):
        scale = float(p.grad.abs().max())  # float32 rounding: the same sums in another order
        torch.testing.assert_close(packed_grad, p.grad, rtol=1e-5, atol=1e-5 * scale)


def test_rows_are_packed_only_where_that_saves_compute():
    policy = model("qwen2")
    distinct = [
        dataclasses.replace(t, prompt_ids=[7] * (5 + k)) for k, t in enumerate(two_groups())
    ]
    assert pack_shared_prompts(pad_batch(distinct, 0), policy.config) is None  # none shared
    # a short prompt, long responses: a packed row per prompt costs more than the rows
    long = two_groups(prompt_len=2, lengths=(300, 300, 300, 300, 300))
    assert pack_shared_prompts(pad_batch(long, 0), policy.config) is None
    policy.config._attn_implementation = "eager"  # a 4D boolean mask is SDPA's
    assert pack_shared_prompts(pad_batch(two_groups(), 0), policy.config) is None
