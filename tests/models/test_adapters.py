"""LoRA adapters on disk (`satseq.models.adapters`): a fresh adapter is its base exactly, the
format is PEFT's, bad target modules are named, and `satseq model merge-lora` writes a model
whose logits are the peft model's."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from satseq.models import is_adapter_dir, load_policy, load_tokenizer, resolve_model_path
from satseq.models.adapters import (
    LoraSpec,
    adapter_base,
    adapter_config,
    initial_adapter,
    linear_module_names,
)

SATSEQ = str(Path(sys.executable).parent / "satseq")
IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("adapter-cache")


@pytest.fixture(scope="module")
def adapter(raw_tiny_model, cache):
    return initial_adapter(raw_tiny_model, LoraSpec(rank=4, alpha=8.0), seed=3, cache_dir=cache)


def logits(model):
    with torch.no_grad():
        return model(IDS).logits


def test_a_fresh_adapter_is_its_base_exactly_and_loads_in_peft(raw_tiny_model, adapter):
    config = adapter_config(adapter)
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    assert adapter_base(adapter) == Path(raw_tiny_model).resolve()
    base, _ = load_policy(raw_tiny_model, "float32")
    expected = logits(base)
    adapted = PeftModel.from_pretrained(load_policy(raw_tiny_model, "float32")[0], str(adapter))
    assert torch.equal(logits(adapted), expected)  # B = 0
    # all-linear: every linear layer but the output layer, by short name
    assert sorted(config["target_modules"]) == linear_module_names(base)
    assert "lm_head" not in config["target_modules"]
    # an adapter dir stands for its agent: resolvable, with the base's tokenizer
    assert is_adapter_dir(adapter) and resolve_model_path(adapter) == adapter
    assert load_tokenizer(adapter).get_vocab() == load_tokenizer(raw_tiny_model).get_vocab()


def test_the_initial_adapter_is_made_once_per_seed(raw_tiny_model, adapter, cache):
    spec = LoraSpec(rank=4, alpha=8.0)
    assert initial_adapter(raw_tiny_model, spec, seed=3, cache_dir=cache) == adapter
    other = initial_adapter(raw_tiny_model, spec, seed=4, cache_dir=cache)
    assert other != adapter
    a = (adapter / "adapter_model.safetensors").read_bytes()
    assert a != (other / "adapter_model.safetensors").read_bytes()  # A is drawn per agent


def test_an_unknown_target_module_is_named(raw_tiny_model, cache):
    spec = LoraSpec(rank=4, alpha=8.0, target_modules=("q_proj", "attn_qkv"))
    with pytest.raises(ValueError, match=r"no linear layers named \['attn_qkv'\]"):
        initial_adapter(raw_tiny_model, spec, seed=0, cache_dir=cache)


def test_merge_lora_writes_the_peft_merged_model(raw_tiny_model, adapter, tmp_path):
    trained = tmp_path / "trained"
    adapted = PeftModel.from_pretrained(load_policy(raw_tiny_model, "float32")[0], str(adapter))
    with torch.no_grad():  # a trained adapter: B moved away from 0
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(0)))
    adapted.save_pretrained(trained)
    expected = logits(adapted)
    assert (expected - logits(load_policy(raw_tiny_model, "float32")[0])).abs().max() > 1e-2
    merged_dir = tmp_path / "merged"
    result = subprocess.run(
        [SATSEQ, "model", "merge-lora", str(trained), "--out", str(merged_dir)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    assert not is_adapter_dir(merged_dir)
    assert torch.allclose(logits(merged), expected, atol=1e-4)
    assert load_tokenizer(merged_dir).get_vocab() == load_tokenizer(raw_tiny_model).get_vocab()


def test_merge_lora_refuses_a_model_directory(raw_tiny_model, tmp_path):
    result = subprocess.run(
        [SATSEQ, "model", "merge-lora", raw_tiny_model, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "not a LoRA adapter directory" in result.stderr


def test_a_merged_adapter_is_made_once_and_anew_for_other_weights(
    raw_tiny_model, adapter, tmp_path
):
    """`eval.merge_lora`: a LoRA agent is scored as its adapter merged into its base, made once
    in the cache, keyed by the adapter's files; a full model is scored as it is."""
    from satseq.evaluation.runner import scored_model_dirs
    from satseq.models.adapters import merged_adapter

    trained = tmp_path / "agent_a0" / "stage_3"
    adapted = PeftModel.from_pretrained(load_policy(raw_tiny_model, "float32")[0], str(adapter))
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
    adapted.save_pretrained(trained)
    cache = tmp_path / "cache"
    merged = merged_adapter(trained, cache)
    assert torch.allclose(
        logits(AutoModelForCausalLM.from_pretrained(merged)), logits(adapted), atol=1e-4
    )
    built = (merged / "config.json").stat().st_mtime_ns
    assert merged_adapter(trained, cache) == merged  # cached: not merged again
    assert (merged / "config.json").stat().st_mtime_ns == built
    adapted.save_pretrained(trained)  # the same weights again: the same key
    assert merged_adapter(trained, cache) == merged
    with torch.no_grad():
        next(p for n, p in adapted.named_parameters() if "lora_B" in n).add_(1.0)
    adapted.save_pretrained(trained)  # retrained in place: merged anew
    assert merged_adapter(trained, cache) != merged
    team = {"a0": trained, "a1": Path(raw_tiny_model)}
    assert scored_model_dirs(team, False) == {"a0": str(trained), "a1": raw_tiny_model}
    scored = scored_model_dirs(team, True)
    assert not is_adapter_dir(scored["a0"]) and scored["a1"] == raw_tiny_model
