"""Token log-probs and the exact vocabulary KL from final hidden states, a chunk at a time.

The learner never materialises logits [batch, seq, vocabulary] (design §11 "Memory"): it takes
the last hidden state h_t [M, H] at the M response states only, and applies the output layer
W [V, H] (and its bias) to `chunk_tokens` states at a time. `FusedOutputLayer` computes the
log-probs, the KL and their gradients as one autograd function: between its forward and its
backward it keeps each state's log-normaliser and KL ([M]), and its backward recomputes each
chunk's probabilities and writes the logits' gradient in place (a call of one chunk keeps that
chunk's instead), so the peak is a few [m, V] buffers of one chunk, never [M, V].

Precision (design §4 "Precision of log-probs"): the output layer's product is float32-accurate
even under bf16 autocast (`OutputLayer.float32_logits`, on by default: `trainer.fp32_head`).
bf16 logits carry ~0.06 nats of rounding at logit scales of 20–30, more than the KL budgets
being checked, and a float32 log-softmax after a bf16 product cannot restore the lost bits. On a
CUDA device the float32-accurate product runs on tensor cores (`split_bf16_product`: W split
once a call into three bf16 pieces, against the bf16 states: three products accumulated in
float32), and the gradient's products as autocast's backward would (one bf16 product each);
elsewhere they are float32 matmuls. With `float32_logits` off, the products run in the
autocast dtype and only the softmax is float32.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK_TOKENS = 1024

Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""a [m, H] × b [n, H] → a bᵀ [m, n] in float32"""


def bf16_pieces(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """x as a sum of bf16 tensors: itself if bf16, else three (x_0 = bf16(x), x_1 = bf16(x − x_0),
    x_2 = bf16(x − x_0 − x_1)), which hold float32's 24 bits."""
    if x.dtype == torch.bfloat16:
        return (x,)
    pieces, rest = [], x.float()
    for _ in range(3):
        pieces.append(rest.bfloat16())
        rest = rest - pieces[-1].float()
    return tuple(pieces)


def split_bf16_product(
    a: torch.Tensor, b: torch.Tensor | tuple[torch.Tensor, ...], mm: Product
) -> torch.Tensor:
    """a bᵀ [m, n] to float32 accuracy from bf16 products accumulated in float32 (`mm` takes
    bf16 operands and returns float32): Σ a_i b_jᵀ over the `bf16_pieces` with i + j ≤ 2 (each
    dropped term is ≤ 2⁻²⁴ of the product); three products for bf16 states and a float32 W,
    six for two float32 operands. `b` may be given as its pieces, split once for many calls."""
    a_pieces = bf16_pieces(a)
    b_pieces = b if isinstance(b, tuple) else bf16_pieces(b)
    product = mm(a_pieces[0], b_pieces[0])
    for i, a_i in enumerate(a_pieces):
        for j, b_j in enumerate(b_pieces):
            if 0 < i + j <= 2:
                product += mm(a_i, b_j)
    return product


def _tensor_core_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16 a [m, H] × b [n, H] → float32 a bᵀ on CUDA's tensor cores, accumulated in float32."""
    return torch.mm(a, b.T, out_dtype=torch.float32)


@functools.cache
def _tensor_cores_return_float32(device: torch.device) -> bool:
    """Whether this torch has bf16 → float32 `torch.mm` on `device` (CUDA, torch ≥ 2.8)."""
    if device.type != "cuda":
        return False
    try:
        one = torch.ones(1, 1, dtype=torch.bfloat16, device=device)
        return _tensor_core_mm(one, one).dtype == torch.float32
    except (RuntimeError, TypeError):
        return False


def on_tensor_cores(x: torch.Tensor) -> bool:
    """Whether a float32-accurate product with `x` runs as bf16 products on tensor cores."""
    return _tensor_cores_return_float32(x.device)


def float32_product(
    a: torch.Tensor, b: torch.Tensor, b_pieces: tuple[torch.Tensor, ...] | None = None
) -> torch.Tensor:
    """a bᵀ [m, n] accurate to float32 from a [m, H], b [n, H] of any float dtype: on tensor
    cores where the device has them (`b_pieces`: b's `bf16_pieces`, where the caller split it
    once), else a float32 (or the inputs' wider) matmul."""
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    with torch.autocast(a.device.type, enabled=False):
        if dtype == torch.float32 and on_tensor_cores(a):
            return split_bf16_product(a, b if b_pieces is None else b_pieces, _tensor_core_mm)
        return a.to(dtype) @ b.to(dtype).T


def gradient_product(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """a bᵀ for a gradient, in float32 or wider: one bf16 product accumulated in float32 on
    tensor cores (as autocast's backward computes; a gradient needs no float32-accurate
    product, the log-probs do), else as `_product` computes it."""
    float32 = torch.promote_types(a.dtype, b.dtype) == torch.float32
    if dtype is None and float32 and on_tensor_cores(a):
        with torch.autocast(a.device.type, enabled=False):
            return _tensor_core_mm(a.bfloat16(), b.bfloat16())
    return _product(a, b, dtype)


@dataclass(frozen=True)
class OutputLayer:
    """The output projection logits = h W^T + b, as plain tensors (W [V, H], b [V] or None).
    float32_logits: the product is float32-accurate whatever autocast says."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    float32_logits: bool = True
    pieces: tuple[torch.Tensor, ...] | None = None
    """W's `bf16_pieces` on tensor cores, split once for a call's chunks (`_prepared`)."""

    def product_dtype(self) -> torch.dtype | None:
        """The dtype the product runs in: None for float32-accurate, else autocast's (or W's)."""
        device = self.weight.device.type
        if self.float32_logits:
            return None
        if torch.is_autocast_enabled(device):
            return torch.get_autocast_dtype(device)
        return self.weight.dtype

    def logits(self, hidden: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """h W^T + b for hidden states [m, H] → [m, V], float32 or wider; `dtype`: the
        product's, as `product_dtype` said when the caller asked."""
        dtype = self.product_dtype() if dtype is None and not self.float32_logits else dtype
        logits = _product(hidden, self.weight, dtype, self.pieces)
        return logits if self.bias is None else logits.add_(self.bias.to(logits.dtype))

    def logprobs(self, hidden: torch.Tensor, temperature: float) -> torch.Tensor:
        """log π(· | s) at `temperature` for hidden states [m, H] → [m, V], float32 or wider
        (in place of the logits where no gradient flows through them)."""
        s = self.logits(hidden).div_(temperature)
        lse = torch.logsumexp(s, -1, keepdim=True)
        return s - lse if s.requires_grad else s.sub_(lse)

    def detached_copy(self, dtype: torch.dtype | None = None) -> OutputLayer:
        """A frozen copy (the stage-start π_cur's output layer, kept while W trains), in
        `dtype` if given (under autocast a bf16 product runs in it anyway); with float32 logits
        the copy stays float32, so π_cur's logits are computed as π_θ's are."""
        dtype = torch.float32 if self.float32_logits else (dtype or self.weight.dtype)
        bias = None if self.bias is None else self.bias.detach().to(dtype, copy=True)
        return OutputLayer(self.weight.detach().to(dtype, copy=True), bias, self.float32_logits)


def _product(
    a: torch.Tensor,
    b: torch.Tensor,
    dtype: torch.dtype | None,
    b_pieces: tuple[torch.Tensor, ...] | None = None,
) -> torch.Tensor:
    """a bᵀ, float32 or wider: float32-accurate for dtype None, else a `dtype` product."""
    if dtype is None:
        return float32_product(a, b, b_pieces)
    with torch.autocast(a.device.type, enabled=False):
        product = a.to(dtype) @ b.to(dtype).T  # no copy of an operand already in `dtype`
    return product.to(torch.promote_types(dtype, torch.float32))


@dataclass(frozen=True)
class _Head:
    """What one `FusedOutputLayer` call computes with besides its differentiable inputs."""

    temperature: float
    chunk_tokens: int
    reference: OutputLayer | None  # π_cur's, constant
    dtype: torch.dtype | None = None  # the product's (`OutputLayer.product_dtype`)

    def layer(self, weight: torch.Tensor, bias: torch.Tensor | None) -> OutputLayer:
        """π_θ's layer of W and b, ready for the call's chunks (`_prepared`)."""
        return _prepared(OutputLayer(weight, bias, self.dtype is None), self.dtype)


def _prepared(layer: OutputLayer, dtype: torch.dtype | None) -> OutputLayer:
    """The layer ready for a call's chunks: W cast once to the product's `dtype`, or split
    once into bf16 pieces for a float32-accurate product on tensor cores (else as it is)."""
    if dtype is not None and layer.weight.dtype != dtype:
        return OutputLayer(layer.weight.to(dtype), layer.bias, layer.float32_logits)
    float32 = torch.promote_types(layer.weight.dtype, torch.float32) == torch.float32
    if dtype is None and float32 and layer.pieces is None and on_tensor_cores(layer.weight):
        pieces = bf16_pieces(layer.weight.detach())
        return OutputLayer(layer.weight, layer.bias, layer.float32_logits, pieces)
    return layer


def _chunks(M: int, size: int) -> list[slice]:
    """`size` states at a time; M = 0: one empty chunk, so the outputs are typed."""
    if size < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {size}")
    return [slice(start, start + size) for start in range(0, max(M, 1), size)]


def _scores(head: _Head, layer: OutputLayer, h: torch.Tensor) -> torch.Tensor:
    """s = logits / T [m, V] for one chunk's states."""
    return layer.logits(h, head.dtype).div_(head.temperature)


def _chunk_forward(head: _Head, layer: OutputLayer, h, y, h_cur, for_gradient: bool = True):
    """One chunk's per-state outputs, log π_θ(y_t | s_t) [m], the log-normaliser [m] and with
    a reference KL(π_θ ‖ π_cur)(s_t) [m] (else None); and what its gradient is made of,
    p = π_θ(· | s_t) [m, V] and a = log π_θ − log π_cur [m, V] (None without a reference;
    p None where not `for_gradient` and no KL needs it). A caller of many chunks keeps only
    the outputs, so that no two chunks' [m, V] tensors are alive at once."""
    s = _scores(head, layer, h)
    lse = torch.logsumexp(s, -1)
    logp = s.gather(1, y.unsqueeze(1)).squeeze(1) - lse
    if head.reference is None:
        p = s.sub_(lse.unsqueeze(1)).exp_() if for_gradient else None
        return (logp, lse, None), (p, None)
    logp_vocabulary = s.sub_(lse.unsqueeze(1))
    a = head.reference.logprobs(h_cur, head.temperature).neg_().add_(logp_vocabulary)
    p = logp_vocabulary.exp_()
    return (logp, lse, torch.linalg.vecdot(p, a)), (p, a)  # design §4 KL: Σ_v p_v a_v


def _score_gradient(p, a, kl, g, g_kl, y) -> torch.Tensor:
    """∂L/∂s [m, V] = g (1[v = y_t] − p_v) + g_KL p_v (a_v − KL_t), written over p and a."""
    if a is None or g_kl is None:
        grad = p.mul_(-g.unsqueeze(1))
    else:
        coefficient = a.sub_(kl.unsqueeze(1)).mul_(g_kl.unsqueeze(1)).sub_(g.unsqueeze(1))
        grad = p.mul_(coefficient)
    return grad.scatter_add_(1, y.unsqueeze(1), g.unsqueeze(1).to(grad.dtype))


class FusedOutputLayer(torch.autograd.Function):
    """log π_θ(y_t | s_t) [M] and KL(π_θ ‖ π_cur)(s_t) [M] from hidden states [M, H], W and
    b, with their gradients, a chunk at a time. With s = logits / T, p = π_θ(· | s_t),
    a = log π_θ − log π_cur, g = ∂L/∂log π_θ(y_t) and g_KL = ∂L/∂KL_t:
    ∂L/∂s_v = g (1[v = y_t] − p_v) + g_KL p_v (a_v − KL_t), and ∂L/∂logits = ∂L/∂s / T.
    Between forward and backward it keeps the inputs and each state's log-normaliser and KL,
    and the backward recomputes each chunk's p and a; where all states are one chunk it keeps
    that chunk's p and a instead (its backward follows the forward with nothing between them
    that needs the memory), saving the recomputation."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, reference_hidden, head: _Head):
        layer = head.layer(weight, bias)
        chunks = _chunks(hidden.shape[0], head.chunk_tokens)
        ctx.kept = None
        if len(chunks) == 1:
            outputs, ctx.kept = _chunk_forward(head, layer, hidden, tokens, reference_hidden)
            parts = [outputs]
        else:
            parts = _chunk_outputs(head, layer, hidden, tokens, reference_hidden, chunks)
        logp, lse, kl = (_cat(parts, i) for i in range(3))
        ctx.head, ctx.weight_dtype = head, weight.dtype
        ctx.save_for_backward(hidden, layer.weight, bias, tokens, reference_hidden, lse, kl)
        return logp, kl

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_logp, g_kl):
        hidden, weight, bias, tokens, reference_hidden, lse, kl = ctx.saved_tensors
        head = ctx.head
        layer = head.layer(weight, bias)
        # W for the gradient's products: its bf16 piece on tensor cores (split once, above)
        w = weight if layer.pieces is None else layer.pieces[0]
        g_logp = torch.zeros_like(lse) if g_logp is None else g_logp
        wide = dict(dtype=torch.promote_types(ctx.weight_dtype, torch.float32), device=w.device)
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]  # a LoRA head is frozen
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, **wide) if need_weight else None
        grad_bias = torch.zeros(weight.shape[0], **wide) if need_bias else None
        for c in _chunks(hidden.shape[0], head.chunk_tokens):
            if ctx.kept is not None:
                (p, a), ctx.kept = ctx.kept, None
            else:
                _, (p, a) = _chunk_forward(
                    head, layer, hidden[c], tokens[c], _rows(reference_hidden, c)
                )
            g_kl_c = None if g_kl is None else g_kl[c]
            grad_s = _score_gradient(p, a, _rows(kl, c), g_logp[c], g_kl_c, tokens[c])
            grad_logits = grad_s.div_(head.temperature)
            if grad_hidden is not None:
                grad_hidden[c] = gradient_product(grad_logits, w.T, head.dtype)
            if grad_weight is not None:
                grad_weight += gradient_product(grad_logits.T, hidden[c].T, head.dtype)
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0)
            del p, a, grad_s, grad_logits  # this chunk's [m, V] tensors, before the next's
        grad_weight = None if grad_weight is None else grad_weight.to(ctx.weight_dtype)
        grad_bias = None if grad_bias is None else grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def _chunk_outputs(head, layer, hidden, tokens, reference_hidden, chunks) -> list[tuple]:
    """Each chunk's per-state outputs (`_chunk_forward`'s first part), its [m, V] tensors
    dropped before the next chunk's are made."""
    return [
        _chunk_forward(head, layer, hidden[c], tokens[c], _rows(reference_hidden, c), False)[0]
        for c in chunks
    ]


def _rows(x: torch.Tensor | None, c: slice) -> torch.Tensor | None:
    return None if x is None else x[c]


def _cat(parts: list[tuple], i: int) -> torch.Tensor | None:
    """The chunks' i-th per-state output, concatenated (None where the chunks have none)."""
    return None if parts[0][i] is None else torch.cat([part[i] for part in parts])


def map_chunks(
    chunk_fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
    rows: tuple[torch.Tensor, ...],
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """chunk_fn over `chunk_tokens` rows at a time of the per-state tensors `rows` (each [M, ...]),
    its per-state outputs ([m] each) concatenated to [M]. Under autograd (a row tensor requires
    grad) each of several chunks is checkpointed: backward recomputes its [m, V] logits instead
    of keeping them. One chunk is not: its backward follows its forward with nothing between
    them that would use the memory, so keeping its tensors peaks about as high as recomputing
    them, and saves the recomputation."""
    M = rows[0].shape[0]
    checkpointed = (
        chunk_tokens < M and torch.is_grad_enabled() and any(r.requires_grad for r in rows)
    )
    outputs = []
    for c in _chunks(M, chunk_tokens):
        chunk = tuple(r[c] for r in rows)
        if checkpointed:
            outputs.append(checkpoint(chunk_fn, *chunk, use_reentrant=False))
        else:
            outputs.append(chunk_fn(*chunk))
    if isinstance(outputs[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*outputs, strict=True))
    return torch.cat(outputs)


def chunked_logprobs_and_kl(
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    layer: OutputLayer,
    temperature: float = 1.0,
    reference_hidden: torch.Tensor | None = None,
    reference: OutputLayer | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π_θ(y_t | s_t) [M] and, given π_cur's hidden states and output layer, the exact
    per-state KL(π_θ ‖ π_cur) [M] (else None), through `FusedOutputLayer`.

    hidden, reference_hidden [M, H]; tokens [M]. Gradients flow into `hidden` and `layer`;
    π_cur's side is constant. Both outputs are float32 (or the inputs' wider dtype).
    """
    if (reference is None) != (reference_hidden is None):
        raise ValueError("the exact KL needs both π_cur's hidden states and its output layer")
    reference = None if reference is None else _prepared(reference, reference.product_dtype())
    head = _Head(temperature, chunk_tokens, reference, layer.product_dtype())
    differentiable = (hidden, layer.weight, layer.bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in differentiable):
        return FusedOutputLayer.apply(
            hidden, layer.weight, layer.bias, tokens, reference_hidden, head
        )
    layer = head.layer(layer.weight, layer.bias)
    chunks = _chunks(hidden.shape[0], chunk_tokens)
    parts = _chunk_outputs(head, layer, hidden, tokens, reference_hidden, chunks)
    return _cat(parts, 0), _cat(parts, 2)
