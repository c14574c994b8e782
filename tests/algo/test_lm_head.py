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


def _llm_scale_problem():
    """Hidden states and an output layer whose logits have an LLM's scale (std ~25)."""
    g = torch.Generator().manual_seed(3)
    M, H, V = 64, 64, 1000
    hidden = torch.randn(M, H, generator=g) * 5.0
    weight = torch.randn(V, H, generator=g) * 0.62  # logits h·w: std ≈ 5 · 0.62 · 8 ≈ 25
    tokens = torch.randint(0, V, (M,), generator=g)
    return hidden, weight, tokens


def test_float32_logits_under_bf16_autocast_match_a_float64_reference():
    """design §4: bf16 logits carry ~0.06 nats of rounding at logit scales of 20–30; the
    float32 output layer keeps the log-probs within 1e-4 of float64 under bf16 autocast."""
    hidden, weight, tokens = _llm_scale_problem()
    reference, _ = chunked_logprobs_and_kl(hidden.double(), tokens, OutputLayer(weight.double()))
    assert float(torch.nn.functional.linear(hidden, weight).std()) > 20
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16_logits, _ = chunked_logprobs_and_kl(
            hidden, tokens, OutputLayer(weight, float32_logits=False)
        )
        fp32_logits, _ = chunked_logprobs_and_kl(hidden, tokens, OutputLayer(weight))
    assert (bf16_logits.double() - reference).abs().max() > 0.01
    assert (fp32_logits.double() - reference).abs().max() < 1e-4


def test_a_float32_heads_reference_copy_stays_float32():
    """π_cur's frozen output layer keeps float32 with a float32 head (its logits are then
    computed exactly as π_θ's at θ = π_cur), and the compute dtype without."""
    _, weight, _ = _llm_scale_problem()
    assert OutputLayer(weight).detached_copy(torch.bfloat16).weight.dtype == torch.float32
    copy = OutputLayer(weight, float32_logits=False).detached_copy(torch.bfloat16)
    assert copy.weight.dtype == torch.bfloat16 and not copy.float32_logits
