"""Rows that share a prompt run packed, the prompt computed once (`satseq.actors.packing`):
every response state and every gradient is the one the rows compute alone, for each
architecture that packs; rows are packed only where that saves compute."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from satseq.actors.forward import PolicyTrunk, response_hidden_states, response_positions
from satseq.actors.packing import PACKABLE_MODELS, layout_tokens, pack, pack_batch
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


def distinct_prompts(lengths=(40, 3, 5, 30, 2, 4)):
    """Six trajectories, each on its own prompt (5 to 8 tokens), of very different lengths: the
    padded rows are mostly padding."""
    g = torch.Generator().manual_seed(2)
    return [
        Trajectory(k, torch.randint(1, 100, (5 + k % 4,), generator=g).tolist(),
                   torch.randint(1, 100, (R,), generator=g).tolist(), [1] * R, [0] * R, "stop")
        for k, R in enumerate(lengths)
    ]  # fmt: skip


BATCHES = {"shared prompts": two_groups, "distinct prompts": distinct_prompts}


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


@pytest.mark.parametrize("batch_kind", sorted(BATCHES))
@pytest.mark.parametrize("kind", sorted(ARCHITECTURES))
def test_packed_states_and_gradients_are_the_rows_own(kind, batch_kind):
    policy = model(kind)
    trunk = PolicyTrunk(policy)
    trajectories = BATCHES[batch_kind]()
    batch = pad_batch(trajectories, 0)
    packed = pack_batch(batch, policy.config)
    assert packed is not None and packed.input_ids.numel() < batch.input_ids.numel()
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
    assert pack_batch(pad_batch(distinct, 0), policy.config) is None  # none shared
    # a short prompt, long responses: a packed row per prompt costs more than the rows
    long = two_groups(prompt_len=2, lengths=(300, 300, 300, 300, 300))
    assert pack_batch(pad_batch(long, 0), policy.config) is None
    policy.config._attn_implementation = "eager"  # a 4D boolean mask is SDPA's
    assert pack_batch(pad_batch(two_groups(), 0), policy.config) is None


def test_trajectories_on_their_own_prompts_pack_into_fewer_rows_without_their_padding():
    # prompts of 2 tokens, responses of 6, 1, 2 and 3: documents of 8, 3, 4 and 5 tokens
    g = torch.Generator().manual_seed(3)
    trajectories = [
        Trajectory(k, [k + 1, k + 2], torch.randint(1, 100, (R,), generator=g).tolist(),
                   [1] * R, [0] * R, "stop")
        for k, R in enumerate((6, 1, 2, 3))
    ]  # fmt: skip
    batch = pad_batch(trajectories, 0)
    assert layout_tokens(batch, None) == (20, 32)  # 4 rows of 8: 12 positions of padding
    packed = pack_batch(batch, model("qwen2").config)
    # first-fit decreasing into rows of 8: [8], [5, 3], [4]
    assert packed.input_ids.shape == (3, 8)
    assert layout_tokens(batch, packed) == (20, 24)
    assert packed.position_ids[1].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(
        st.tuples(st.integers(1, 6), st.lists(st.integers(1, 7), min_size=1, max_size=4)),
        min_size=1,
        max_size=5,
    ),
    share_prompts=st.booleans(),
)
def test_every_state_attends_to_exactly_its_own_context_at_its_own_positions(groups, share_prompts):
    """groups: (prompt length, response lengths) per prompt; the rows interleaved."""
    g = torch.Generator().manual_seed(len(groups))
    trajectories = []
    for k, (P, lengths) in enumerate(groups):
        prompt = torch.randint(1, 100, (P,), generator=g).tolist()
        for R in lengths:
            response = torch.randint(1, 100, (R,), generator=g).tolist()
            trajectories.append(Trajectory(k, prompt, response, [1] * R, [0] * R, "stop"))
    trajectories = trajectories[::2] + trajectories[1::2]
    batch = pad_batch(trajectories, 0)
    packed = pack(batch, share_prompts)
    assert packed.input_ids.shape[1] <= max(
        P + (sum(lengths) if share_prompts else max(lengths)) for P, lengths in groups
    )
    assert packed.input_ids.shape[0] <= len(trajectories)
    assert packed.tokens == sum(
        P + sum(lengths) if share_prompts else P * len(lengths) + sum(lengths)
        for P, lengths in groups
    )
    mask = packed.attention_mask[:, 0]
    assert mask.diagonal(dim1=-2, dim2=-1).all()  # no query sees nothing (padding included)
    for row, t in enumerate(trajectories):
        context = t.prompt_ids + t.response_ids
        for step in range(len(t.response_ids)):
            r, q = packed.state_rows[row, step], packed.state_positions[row, step]
            keys = mask[r, q].nonzero().squeeze(-1)
            visible = len(t.prompt_ids) + step  # s_t sees the prompt and y_<t
            assert packed.input_ids[r, keys].tolist() == context[:visible]
            assert packed.position_ids[r, keys].tolist() == list(range(visible))
            assert keys[-1] == q  # and is the last of them
