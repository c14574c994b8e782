"""`team.agents[i].trust_remote_code`: a model that ships its own architecture loads only from a
directory the command trusts, in this process and in every Ray worker started after."""

import json
import shutil

import pytest

from satseq.model_trust import TRUSTED_ENV, trust, trusts
from satseq.models import ModelLoadError, load_policy

CUSTOM_CODE = """
from transformers import Qwen2Config, Qwen2ForCausalLM


class CustomConfig(Qwen2Config):
    model_type = "satseq_custom"


class CustomForCausalLM(Qwen2ForCausalLM):
    config_class = CustomConfig
"""


@pytest.fixture
def custom_model(raw_tiny_model, tmp_path, monkeypatch):
    """The tiny model as an architecture transformers does not have: its code in the dir."""
    monkeypatch.delenv(TRUSTED_ENV, raising=False)
    directory = tmp_path / "custom"
    shutil.copytree(raw_tiny_model, directory)
    (directory / "custom_qwen.py").write_text(CUSTOM_CODE)
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "satseq_custom"
    config["auto_map"] = {
        "AutoConfig": "custom_qwen.CustomConfig",
        "AutoModelForCausalLM": "custom_qwen.CustomForCausalLM",
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_a_models_own_code_runs_only_where_trusted(custom_model, tmp_path):
    with pytest.raises((ModelLoadError, ValueError), match="trust_remote_code"):
        load_policy(custom_model, "float32")
    assert not trusts(custom_model)
    trust([tmp_path])  # a directory above it: a run's agent_<name>/ covers its stages
    assert trusts(custom_model) and not trusts(tmp_path.parent)
    model, _ = load_policy(custom_model, "float32")
    assert type(model).__name__ == "CustomForCausalLM"


@pytest.mark.slow
def test_ray_workers_read_the_same_trust(custom_model, monkeypatch):
    import ray

    from satseq.launch.connection import connect

    trust([custom_model])
    connect(None)
    try:

        @ray.remote
        def loads() -> str:
            from satseq.models import load_policy

            return type(load_policy(str(custom_model), "float32")[0]).__name__

        assert ray.get(loads.remote()) == "CustomForCausalLM"
    finally:
        ray.shutdown()
