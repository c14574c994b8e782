"""A learner step reads the device back a fixed number of times, however many micro-batches it
takes: each read waits for the device's queue to drain (on a GPU, the step's forward and
backward passes stall behind it), so the statistics, the gradient norm and the recorded
log-probs come back in one transfer at the step's end, and what the step needs to know of the
batch's layout is worked out on the host beforehand.

On the CPU every tensor is the host's, so this counts every call that would read an
accelerator's tensor back (`float(t)`, `.tolist()`, `.cpu()`, a bool mask's indexing...)
inside a step, whatever tensor it is called on."""

import sys
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

import satseq
from satseq.actors.host_reads import read_back
from satseq.actors.learner import update
from tests.actors.test_learner import make_learner, trajectories

READS = {"__float__", "__int__", "__bool__", "item", "tolist", "cpu", "numpy", "nonzero"}
SATSEQ = str(Path(satseq.__file__).parent)


class HostReads(TorchFunctionMode):
    """Counts satseq's calls that read a tensor back to the host, by name: not those on what
    `read_back` already brought to the host (marked `on_host`) or was computed from only that,
    nor a library's own (AdamW's step counters live on the host; transformers checks an
    attention mask for padding once per forward pass)."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        bool_index = name in ("__getitem__", "__setitem__") and _is_bool_mask(args[1])
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        on_host = bool(inputs) and all(getattr(t, "on_host", False) for t in inputs)
        if (name in READS or bool_index) and not on_host and _called_from_satseq():
            self.counts[name] += 1
        result = func(*args, **(kwargs or {}))
        if on_host:
            _mark_on_host(tree_flatten(result)[0])
        return result


def _mark_on_host(values) -> None:
    for value in values:
        if isinstance(value, torch.Tensor):
            value.on_host = True


def _called_from_satseq() -> bool:
    """Whether the nearest caller outside torch is satseq's code (not the optimiser's)."""
    frame = sys._getframe(2)
    while frame is not None and "/torch/" in frame.f_code.co_filename:
        if "/torch/optim/" in frame.f_code.co_filename:
            return False
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(SATSEQ)


def _is_bool_mask(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def reads_per_call(monkeypatch, model: str, micro_batch_size: int) -> dict[str, list[int]]:
    """The reads inside each optimiser step and each KL check of one update of agent 0, in
    micro-batches of `micro_batch_size` trajectories (two epochs, the penalty on)."""
    learner = make_learner(model, micro_batch_size=micro_batch_size, kl_coef=0.5, ppo_epochs=2)
    batch = trajectories(learner.policy.tokenizer)
    logp_cur = learner.logprobs(batch)
    counted: dict[str, list[int]] = {"optimizer_step": [], "kl_check": []}

    def marking_read_back(tensors):
        host = read_back(tensors)
        _mark_on_host(host)
        return host

    def counting(original, name):
        def counted_call(*args, **kwargs):
            with HostReads() as reads:
                result = original(*args, **kwargs)
            counted[name].append(sum(reads.counts.values()))
            return result

        return counted_call

    with monkeypatch.context() as patch:
        patch.setattr(update, "read_back", marking_read_back)
        for name in counted:
            patch.setattr(update, name, counting(getattr(update, name), name))
        learner.update(batch, logp_cur, torch.tensor([1.0, -0.5, 0.3, -1.0]), torch.ones(4))
    return counted


def test_a_step_reads_back_once_however_many_micro_batches(monkeypatch, raw_tiny_model):
    one = reads_per_call(monkeypatch, raw_tiny_model, micro_batch_size=4)
    four = reads_per_call(monkeypatch, raw_tiny_model, micro_batch_size=1)
    assert one == four  # nothing is read per micro-batch
    assert len(one["optimizer_step"]) == 2 and len(one["kl_check"]) == 2
    assert one == {"optimizer_step": [1, 1], "kl_check": [1, 1]}  # read_back's one transfer


def test_read_back_keeps_shapes_and_values():
    tensors = [torch.arange(6.0).view(2, 3), torch.tensor(7.0), torch.tensor([True, False])]
    host = read_back(tensors)
    assert [t.shape for t in host] == [t.shape for t in tensors]
    assert all(torch.equal(h, t.float()) for h, t in zip(host, tensors, strict=True))
    assert read_back([]) == []
