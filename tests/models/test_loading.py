"""`load_policy` / `resolve_model_path`: local dirs, builtin names, and Hub names that cannot be
fetched, which fail fast with a `ModelLoadError` that says what to do."""

import shutil
import time

import pytest
import torch

from satseq.models import ModelLoadError, load_policy, resolve_model_path


def test_loads_a_local_directory_in_the_requested_dtype(tiny_model_dir):
    model, tokenizer = load_policy(str(tiny_model_dir), dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    assert not model.training
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token is not None


def test_builtin_name_resolves_through_the_default_cache(tiny_model_dir, satseq_cache, monkeypatch):
    monkeypatch.setenv("SATSEQ_CACHE", str(satseq_cache))
    assert resolve_model_path("builtin:tiny") == tiny_model_dir


def test_hub_name_in_the_hf_cache_loads_with_no_network(tiny_model_dir, monkeypatch, tmp_path):
    # The Hugging Face cache layout: refs/main names the commit whose snapshot holds the files.
    commit = "0" * 40
    repo_cache = tmp_path / "hub" / "models--satseq-test--cached-tiny"
    shutil.copytree(tiny_model_dir, repo_cache / "snapshots" / commit)
    (repo_cache / "refs").mkdir()
    (repo_cache / "refs" / "main").write_text(commit)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    assert resolve_model_path("satseq-test/cached-tiny") == repo_cache / "snapshots" / commit
    model, _ = load_policy("satseq-test/cached-tiny")
    assert model.config.model_type == "qwen2"


def test_a_revision_picks_that_snapshot_of_a_hub_model(tiny_model_dir, monkeypatch, tmp_path):
    """`team.agents[i].revision`: the cache holds two commits, main and a tag v1; each resolves
    to its own snapshot. A revision of a local or builtin model is refused, naming it."""
    main, tagged = "0" * 40, "1" * 40
    repo_cache = tmp_path / "hub" / "models--satseq-test--versioned"
    for commit in (main, tagged):
        shutil.copytree(tiny_model_dir, repo_cache / "snapshots" / commit)
    (repo_cache / "refs").mkdir()
    (repo_cache / "refs" / "main").write_text(main)
    (repo_cache / "refs" / "v1").write_text(tagged)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    assert resolve_model_path("satseq-test/versioned") == repo_cache / "snapshots" / main
    assert resolve_model_path("satseq-test/versioned", "v1") == repo_cache / "snapshots" / tagged
    assert resolve_model_path("satseq-test/versioned", tagged) == repo_cache / "snapshots" / tagged
    with pytest.raises(ModelLoadError, match=r"local or builtin.*'v1'"):
        resolve_model_path(tiny_model_dir, "v1")


def test_unknown_hub_name_fails_fast_with_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    name = "satseq-test-org/no-such-model"
    started = time.perf_counter()
    with pytest.raises(ModelLoadError) as error:
        load_policy(name)
    elapsed = time.perf_counter() - started
    message = str(error.value)
    assert name in message
    assert "not a local directory" in message
    assert "could not be fetched from the Hub" in message
    assert "download it on a connected machine" in message
    assert elapsed < 15.0  # the probe's timeout bounds it, even with no network at all


def test_offline_mode_fails_without_touching_the_network(monkeypatch, tmp_path):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE is set"):
        resolve_model_path("Qwen/Qwen3-4B")


def test_path_that_does_not_exist_is_reported_as_a_path(tmp_path):
    with pytest.raises(ModelLoadError, match="is not a directory"):
        resolve_model_path(str(tmp_path / "missing" / "model"))
    with pytest.raises(ModelLoadError, match="is not a directory"):
        resolve_model_path("./checkpoints/agent_a0")


def test_directory_without_config_is_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        resolve_model_path(tmp_path)


def test_invalid_names_and_dtypes_are_named(tiny_model_dir):
    with pytest.raises(ModelLoadError, match="not a valid Hugging Face Hub name"):
        resolve_model_path("bad name with spaces")
    with pytest.raises(ModelLoadError, match="unknown builtin model"):
        resolve_model_path("builtin:huge")
    with pytest.raises(ModelLoadError, match="unknown dtype 'fp8'"):
        load_policy(tiny_model_dir, dtype="fp8")
