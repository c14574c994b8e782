"""Chunked log-probs and exact KL from hidden states (the fused output layer) equal the
whole-vocabulary computation, values and gradients, whatever the chunk size, and keep a float64
reference's accuracy in float32 and under bf16 autocast."""

import gc
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from satseq.algo.kl import kl_exact
from satseq.algo.lm_head import (
    OutputLayer,
    bf16_pieces,
    chunked_logprobs_and_kl,
    split_bf16_product,
)
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


@settings(max_examples=40, deadline=None)
@given(
    M=st.integers(1, 20),
    chunk=st.integers(1, 25),
    temperature=st.floats(0.3, 2.0),
    seed=st.integers(0, 10_000),
    with_bias=st.booleans(),
    masked=st.floats(0.0, 1.0),
)
def test_chunked_equals_whole_vocabulary_values_and_gradients(
    M, chunk, temperature, seed, with_bias, masked
):
    """Values and gradients into the states, W and b, under upstream gradients of either sign
    with a random fraction of masked tokens (gradient 0), against autograd over [M, V]."""
    H, V = 4, 11
    hidden, reference_hidden, weight, bias, reference, tokens = _problem(M, H, V, seed)
    bias = bias if with_bias else None
    g = torch.Generator().manual_seed(seed + 1)
    keep = (torch.rand(M, generator=g) >= masked).double()
    g_logp = torch.randn(M, generator=g, dtype=torch.float64) * keep
    g_kl = torch.rand(M, generator=g, dtype=torch.float64) * keep

    def chunked(h, w, b):
        return chunked_logprobs_and_kl(
            h, tokens, OutputLayer(w, b), temperature, reference_hidden, reference, chunk
        )

    def whole(h, w, b):
        logits = h @ w.T + (0 if b is None else b)
        logp = token_logprobs(logits.unsqueeze(0), tokens.unsqueeze(0), temperature)[0]
        kl = kl_exact(logits, reference_hidden @ reference.weight.T, temperature)
        return logp, kl

    results = []
    for f in (chunked, whole):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        b = None if bias is None else bias.clone().requires_grad_()
        logp, kl = f(h, w, b)
        ((logp * g_logp).sum() + (kl * g_kl).sum()).backward()
        results.append((logp.detach(), kl.detach(), h.grad, w.grad, None if b is None else b.grad))
    for got, want in zip(*results, strict=True):
        if want is not None:
            torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-6)


def test_without_a_reference_the_gradient_is_the_log_probs_alone():
    """KL's output is None and the log-probs' gradient equals autograd's over [M, V]."""
    hidden, _, weight, bias, _, tokens = _problem(9, 4, 13, 5)
    grads = []
    for fused in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if fused:
            logp, kl = chunked_logprobs_and_kl(h, tokens, OutputLayer(w, bias), 0.7, chunk_tokens=4)
            assert kl is None
        else:
            logp = token_logprobs((h @ w.T + bias).unsqueeze(0), tokens.unsqueeze(0), 0.7)[0]
        (logp * torch.arange(9.0, dtype=torch.float64)).sum().backward()
        grads.append((h.grad, w.grad))
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want)


def test_nothing_the_size_of_the_vocabulary_is_kept_between_forward_and_backward():
    """Saved for backward: the inputs (W among them) and two floats a state, no [M, V]."""
    M, H, V = 40, 8, 500
    hidden, reference_hidden, weight, bias, reference, tokens = _problem(M, H, V, 1)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, kl = chunked_logprobs_and_kl(
            h, tokens, OutputLayer(w, bias), 1.0, reference_hidden, reference, chunk_tokens=8
        )
    (logp.sum() + kl.sum()).backward()
    inputs = {t.data_ptr() for t in (h, w, bias, tokens, reference_hidden)}
    made_here = [t for t in saved if t.data_ptr() not in inputs]
    assert sum(t.numel() for t in made_here) == 2 * M  # the log-normaliser and the KL
    assert h.grad is not None and w.grad is not None


def _process_bytes(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text())[1]) * 1024


def _peak_rss_resets() -> bool:
    """Whether this process may reset its peak RSS (Linux's /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _peak_rss_resets(), reason="no peak-RSS reset (/proc/self/clear_refs)")
@pytest.mark.parametrize("with_kl", [False, True], ids=["log-probs", "log-probs and KL"])
def test_a_call_holds_a_few_chunks_of_logits_at_once_however_many_chunks_it_has(with_kl):
    """The peak of a forward and backward, in [chunk, V] float32 buffers: p, a and a
    log-sum-exp's temporary (2 without the KL), for 1 chunk as for 4. A buffer here is 36 MiB,
    above glibc's largest mmap threshold, so each is its own mapping, given back when freed,
    and the process's peak RSS counts the buffers alive at once."""
    H, V, chunk = 16, 36864, 256
    buffer = chunk * V * 4
    for M in (chunk, 4 * chunk):
        hidden, reference_hidden, weight, bias, reference, tokens = _problem(M, H, V, 2)
        h, w = hidden.float().requires_grad_(), weight.float().requires_grad_()
        reference_hidden, bias = reference_hidden.float(), bias.float()
        reference = OutputLayer(reference.weight.float())
        references = (reference_hidden, reference) if with_kl else (None, None)
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts again from here
        before = _process_bytes("VmRSS")
        logp, kl = chunked_logprobs_and_kl(
            h, tokens, OutputLayer(w, bias), 1.0, *references, chunk_tokens=chunk
        )
        (logp.sum() + (kl.sum() if with_kl else 0)).backward()
        buffers = (_process_bytes("VmHWM") - before) / buffer
        assert buffers < (3.5 if with_kl else 2.5), (M // chunk, buffers)


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


def test_fused_float32_head_under_bf16_autocast_within_the_design_tolerances():
    """design §4: ≤ 1e-4 nats a token, and ≤ 1e-3 in the log-prob of a 1,536-token sequence
    (their sum), against float64, at an LLM's logit scale, with bf16 hidden states under bf16
    autocast; the gradient into the states within 1 % of float64's largest entry (it is rounded
    to the states' bf16)."""
    g = torch.Generator().manual_seed(7)
    M, H, V = 1536, 64, 2000
    hidden = (torch.randn(M, H, generator=g) * 5.0).bfloat16().float()
    weight = torch.randn(V, H, generator=g) * 0.62
    tokens = torch.randint(0, V, (M,), generator=g)
    reference, _ = chunked_logprobs_and_kl(hidden.double(), tokens, OutputLayer(weight.double()))
    h = hidden.bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = chunked_logprobs_and_kl(h, tokens, OutputLayer(weight), chunk_tokens=256)
    logp.sum().backward()
    error = (logp.double() - reference).abs()
    assert error.max() < 1e-4
    assert abs(float(logp.detach().double().sum() - reference.sum())) < 1e-3
    h64 = hidden.double().requires_grad_()
    chunked_logprobs_and_kl(h64, tokens, OutputLayer(weight.double()))[0].sum().backward()
    gap = (h.grad.double() - h64.grad).abs().max() / h64.grad.abs().max()
    assert gap < 1e-2


def test_the_kl_at_theta_equal_to_pi_cur_is_exactly_zero():
    """π_cur's frozen copy of the layer over the same states: KL 0 in every state, not ~1e-7."""
    hidden, weight, tokens = _llm_scale_problem()
    layer = OutputLayer(weight.clone().requires_grad_())
    _, kl = chunked_logprobs_and_kl(
        hidden, tokens, layer, 0.8, hidden, layer.detached_copy(), chunk_tokens=16
    )
    assert (kl == 0).all()


@pytest.mark.parametrize("states", [torch.bfloat16, torch.float32])
def test_the_split_bf16_product_keeps_float32_accuracy_in_log_probs(states):
    """The tensor-core form of a float32 head (bf16 products accumulated in float32, used on
    CUDA), emulated here with exact bf16 products and float32 sums: log-probs within 1e-4 of
    float64 at an LLM's logit scale, for bf16 states (3 products) and float32 ones (6), where
    one bf16 product is off by > 0.01; the pieces sum back to the operand."""
    hidden, weight, tokens = _llm_scale_problem()
    hidden = hidden.to(states)
    calls = []

    def bf16_mm(a, b):
        assert a.dtype == b.dtype == torch.bfloat16
        calls.append(1)
        return a.float() @ b.float().T

    def logprobs(logits):
        return torch.log_softmax(logits.double(), -1).gather(1, tokens[:, None])

    exact = logprobs(hidden.double() @ weight.double().T)
    split = logprobs(split_bf16_product(hidden, weight, bf16_mm))
    assert len(calls) == (3 if states == torch.bfloat16 else 6)
    assert (split - exact).abs().max() < 1e-4
    single = logprobs(bf16_mm(hidden.bfloat16(), weight.bfloat16()))
    assert (single - exact).abs().max() > 1e-2
    assert torch.equal(sum(p.double() for p in bf16_pieces(weight)), weight.double())


def test_a_float32_heads_reference_copy_stays_float32():
    """π_cur's frozen output layer keeps float32 with a float32 head (its logits are then
    computed exactly as π_θ's at θ = π_cur), and the compute dtype without."""
    _, weight, _ = _llm_scale_problem()
    assert OutputLayer(weight).detached_copy(torch.bfloat16).weight.dtype == torch.float32
    copy = OutputLayer(weight, float32_logits=False).detached_copy(torch.bfloat16)
    assert copy.weight.dtype == torch.bfloat16 and not copy.float32_logits


def test_the_tensor_core_path_emulated_on_the_cpu(monkeypatch):
    """The CUDA path (`torch.mm` of bf16 operands into float32) cannot run here: with the
    device said to have tensor cores and that product emulated exactly (bf16 operands, float32
    sums), a call splits W into bf16 pieces once for all its chunks (and once in backward),
    the log-probs and KL keep float64's within 1e-4, and the gradients (one bf16 product each,
    as autocast's backward) stay within bf16's rounding of float64's."""
    import satseq.algo.lm_head as lm_head

    products, splits = [], []

    def bf16_mm(a, b):
        assert a.dtype == b.dtype == torch.bfloat16
        products.append(1)
        return a.float() @ b.float().T

    pieces = lm_head.bf16_pieces
    monkeypatch.setattr(lm_head, "_tensor_cores_return_float32", lambda device: True)
    monkeypatch.setattr(lm_head, "_tensor_core_mm", bf16_mm)
    monkeypatch.setattr(lm_head, "bf16_pieces", lambda x: splits.append(x.shape) or pieces(x))
    hidden, weight, tokens = _llm_scale_problem()
    states = hidden.bfloat16().requires_grad_()
    w = weight.clone().requires_grad_()
    logp, kl = chunked_logprobs_and_kl(
        states, tokens, OutputLayer(w), 1.0, states.detach(), OutputLayer(weight * 1.01), 16
    )
    (logp.sum() + kl.sum()).backward()

    h64, w64 = states.detach().double().requires_grad_(), weight.double().requires_grad_()
    reference = OutputLayer(weight.double() * 1.01)
    logp64, kl64 = chunked_logprobs_and_kl(
        h64, tokens, OutputLayer(w64), 1.0, h64.detach(), reference
    )
    (logp64.sum() + kl64.sum()).backward()
    assert (logp.double() - logp64).abs().max() < 1e-4
    assert (kl.double() - kl64).abs().max() < 1e-4
    assert (w.grad.double() - w64.grad).abs().max() < 1e-2 * w64.grad.abs().max()
    assert (states.grad.double() - h64.grad).abs().max() < 1e-2 * h64.grad.abs().max()
    weight_splits = [shape for shape in splits if shape == weight.shape]
    assert len(weight_splits) == 3  # π_θ's W in forward and in backward, π_cur's once


def test_a_frozen_output_layer_gets_no_gradient_and_costs_no_product(monkeypatch):
    """A LoRA agent's head is frozen: backward computes the states' gradient alone (one product
    a chunk, not two), equal to the trainable head's."""
    import satseq.algo.lm_head as lm_head

    hidden, reference_hidden, weight, bias, reference, tokens = _problem(12, 4, 9, 2)
    grads, products = [], []
    gradient_product = lm_head.gradient_product
    monkeypatch.setattr(
        lm_head, "gradient_product", lambda *a: products.append(1) or gradient_product(*a)
    )
    for trainable in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_(trainable)
        logp, kl = chunked_logprobs_and_kl(
            h, tokens, OutputLayer(w, bias), 0.9, reference_hidden, reference, chunk_tokens=5
        )
        (logp.sum() + kl.sum()).backward()
        grads.append(h.grad)
        assert (w.grad is not None) == trainable
        assert len(products) == (6 if trainable else 9)  # 3 chunks: 2 products each, then 1
    torch.testing.assert_close(grads[0], grads[1])
