"""Chunked log-probs and exact KL from hidden states equal the whole-vocabulary computation,
values and gradients, whatever the chunk size."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satseq.algo.kl import kl_exact
from satseq.algo.lm_head import OutputLayer, chunked_logprobs_and_kl
from satseq.algo.logprobs import token_logprobs


def test_a_hand_computed_token_and_kl():
    # one state, vocabulary 2: logits (log 3, 0) → π_θ = (3/4, 1/4); π_cur = (1/2, 1/2)
    hidden = torch.tensor([[1.0]])
    layer = OutputLayer(torch.tensor([[torch.log(torch.tensor(3.0))], [0.0]]))
    reference = OutputLayer(torch.tensor([[0.0], [0.0]]))
    logp, kl = chunked_logprobs_and_kl(
        hidden, torch.tensor([1]), layer, reference_hidden=hidden, reference=reference
    )
    assert torch.allclose(logp, torch.log(torch.tensor([0.25])))
    expected = 0.75 * torch.log(torch.tensor(1.5)) + 0.25 * torch.log(torch.tensor(0.5))
    assert torch.allclose(kl, expected.reshape(1), atol=1e-7)


def _problem(M, H, V, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(M, H, generator=g, dtype=torch.float64)
    reference_hidden = hidden + 0.1 * torch.randn(M, H, generator=g, dtype=torch.float64)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64)
    bias = torch.randn(V, generator=g, dtype=torch.float64)
    reference = OutputLayer(weight + 0.1 * torch.randn(V, H, generator=g, dtype=torch.float64))
    tokens = torch.randint(0, V, (M,), generator=g)
    return hidden, reference_hidden, weight, bias, reference, tokens


@settings(max_examples=25, deadline=None)
@given(
    M=st.integers(1, 20),
    chunk=st.integers(1, 25),
    temperature=st.floats(0.3, 2.0),
    seed=st.integers(0, 10_000),
)
def test_chunked_equals_whole_vocabulary_values_and_gradients(M, chunk, temperature, seed):
    H, V = 4, 11
    hidden, reference_hidden, weight, bias, reference, tokens = _problem(M, H, V, seed)

    def chunked(h, w):
        logp, kl = chunked_logprobs_and_kl(
            h, tokens, OutputLayer(w, bias), temperature, reference_hidden, reference, chunk
        )
        return logp, kl

    def whole(h, w):
        logits = h @ w.T + bias
        logp = token_logprobs(logits.unsqueeze(0), tokens.unsqueeze(0), temperature)[0]
        kl = kl_exact(logits, reference_hidden @ reference.weight.T, temperature)
        return logp, kl

    results = []
    for f in (chunked, whole):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        logp, kl = f(h, w)
        (logp.sum() * 0.7 + kl.sum() * 1.3).backward()
        results.append((logp.detach(), kl.detach(), h.grad, w.grad))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-6)


def test_without_reference_only_logprobs_and_no_kl_upcast_from_bf16():
    hidden, _, weight, _, _, tokens = _problem(5, 3, 7, 0)
    layer = OutputLayer(weight.bfloat16())
    logp, kl = chunked_logprobs_and_kl(hidden.bfloat16(), tokens, layer, chunk_tokens=2)
    assert kl is None and logp.shape == (5,) and logp.dtype == torch.float32
    assert (logp <= 0).all()
