"""Torch modes that watch what the learner creates, so a CPU run catches device and memory bugs.

`NamedDevices` fails every tensor that satseq's own code creates without naming its device:
on a GPU such a tensor lands on the CPU and meets CUDA tensors (the learner once crashed at
its first GPU step that way: `torch.arange(T)` added to CUDA positions). The check is by the
calling frame's file, so library code (transformers) is left to its own conventions.

`LargestVocabularyTensor` records the most rows of any tensor whose last dimension is the
vocabulary, across every operation autograd and the kernels run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import satseq

SATSEQ_DIR = str(Path(satseq.__file__).parent)
FACTORIES = {
    torch.arange,
    torch.as_tensor,
    torch.empty,
    torch.eye,
    torch.full,
    torch.linspace,
    torch.ones,
    torch.rand,
    torch.randint,
    torch.randn,
    torch.randperm,
    torch.tensor,
    torch.zeros,
}


class NamedDevices(TorchFunctionMode):
    """Records `file:line torch.<factory>` for each factory call without `device=` made from
    a file under one of `roots` (satseq's package by default)."""

    def __init__(self, roots: tuple[str, ...] = (SATSEQ_DIR,)):
        super().__init__()
        self.roots = roots
        self.violations: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        converts_a_tensor = func is torch.as_tensor and isinstance(args[0], torch.Tensor)
        if func in FACTORIES and "device" not in kwargs and not converts_a_tensor:
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(self.roots):
                line = sys._getframe(1).f_lineno
                self.violations.append(f"{caller}:{line} torch.{func.__name__}")
        return func(*args, **kwargs)


class LargestVocabularyTensor(TorchDispatchMode):
    """The most rows (numel / V) of any tensor an operation computes with last dimension V
    (views, such as the transposed output layer W^T [H, V], allocate nothing and are skipped)."""

    def __init__(self, vocabulary_size: int):
        super().__init__()
        self.V = vocabulary_size
        self.rows = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            return out
        for tensor in out if isinstance(out, tuple | list) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.dim() and tensor.shape[-1] == self.V:
                self.rows = max(self.rows, tensor.numel() // self.V)
        return out
