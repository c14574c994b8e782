"""A LoRA team end to end (design §12): `satseq train configs/smollm2_lora.yaml`, shrunk to one
small stage, trains three SmolLM2-135M adapters, each generating on an engine of its own with its
adapter merged in (`rollout.lora_engines: merged`); each agent's saved stage is an adapter
directory that peft and one shared multi-LoRA vLLM engine load; `satseq eval` scores the team
(the adapters merged, `eval.merge_lora`) and `satseq serve` answers `/predict` with one engine
for the three agents.

Memory: the config's own first 2 stages peaked at 5.7 GB on one shared engine (the sum of the
run's processes' proportional set sizes, `bench/bench_lora_team.py`; merged engines: not
measured), against ~15 GB for two full agents in tests/e2e/test_smollm2.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import ray
import torch
import yaml
from peft import PeftModel
from ray import serve

from satseq.actors.engines.lora import team_engines
from satseq.actors.trajectory import SamplingSpec
from satseq.config import run_config_for
from satseq.data import PromptFormat, make_split
from satseq.data.prompts import prompt_ids
from satseq.models import is_adapter_dir, load_policy, load_tokenizer, resolve_model_path
from satseq.models.adapters import adapter_base, adapter_config
from satseq.serving.app import INGRESS, start_server
from tests.cluster.runs import free_port
from tests.e2e.test_smollm2 import satseq

# one SmolLM2 team at a time, on one xdist worker: each needs most of a worker's memory
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "smollm2_lora.yaml"
AGENTS = ["a0", "a1", "a2"]
TINY_RUN = [
    "trainer.stages=1",
    "trainer.batch_size=2",
    "sat_seq.group_size=2",
    "rollout.max_new_tokens=24",
    "trainer.val_every=0",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smollm2-lora-run")
    overrides = [arg for key in TINY_RUN for arg in ("--set", key)]
    satseq("train", str(CONFIG), "--output-dir", str(out), *overrides, timeout=900)
    return out


def test_each_agent_saves_an_adapter_that_peft_and_one_vllm_engine_load(trained):
    (metrics,) = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert metrics["stage"] == 0
    base = resolve_model_path("builtin:smollm2-135m")
    adapters = {name: str(trained / f"agent_{name}" / "stage_0") for name in AGENTS}
    for directory in adapters.values():
        assert is_adapter_dir(directory) and not (Path(directory) / "config.json").exists()
        assert adapter_config(directory)["r"] == 16 and adapter_base(directory) == base
    model, tokenizer = load_policy(base, "float32")
    adapted = PeftModel.from_pretrained(model, adapters["a0"])
    assert sum(p.numel() for n, p in adapted.named_parameters() if "lora_" in n) == 4_884_480
    engines = team_engines("vllm", adapters, dict.fromkeys(AGENTS, 0), {})
    try:
        assert len({id(engine.shared) for engine in engines.values()}) == 1
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        calculator = PromptFormat(
            answer_instruction="", system_prompt="You are a calculator. Reply with \\boxed{x}."
        )
        prompt = prompt_ids(tokenizer, make_split("test", 1, style="words")[0], calculator)
        for engine in engines.values():
            (sample,) = engine.generate([prompt], SamplingSpec(temperature=0.0))[0]
            assert sample.finish_reason == "stop" and sample.token_ids[-1] == im_end
    finally:
        for engine in engines.values():
            engine.close()
    with torch.no_grad():  # the adapters' weights are finite after training
        assert all(torch.isfinite(p).all() for p in adapted.parameters())


def test_eval_scores_the_lora_team(trained, tmp_path):
    out = tmp_path / "eval"
    args = ["--dataset", "synthetic:test", "--checkpoint-dir", str(trained)]
    args += ["--output-dir", str(out), "--samples-per-agent", "1"]
    args += ["--set", "eval.synthetic_problems=3", "--set", "eval.max_new_tokens=32"]
    satseq("eval", *args, timeout=600)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_problems"] == 3 and sorted(summary["per_agent"]) == AGENTS
    predictions = [json.loads(p) for p in (out / "predictions.jsonl").read_text().splitlines()]
    assert all(sorted(p["individual_answers"]) == AGENTS for p in predictions)
    scored = yaml.safe_load((out / "inference_config.yaml").read_text())["agents"]
    assert all(is_adapter_dir(scored[name]["path"]) for name in AGENTS)
    assert all(not is_adapter_dir(scored[name]["merged"]) for name in AGENTS)  # eval.merge_lora


def test_a_served_lora_team_answers_predict_from_one_engine(trained):
    config = run_config_for(trained, ["serve.max_tokens=32", "serve.api_key_env=SATSEQ_NO_KEY"])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        url = start_server(config, trained, port=free_port())
        deployments = serve.status().applications["satseq"].deployments
        assert sorted(deployments) == sorted([INGRESS, "lora_base_0"])  # one engine, 3 agents
        problem = {"problem": "What is seven plus 12?"}
        reply = httpx.post(f"{url}/predict", json=problem, timeout=300)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert sorted(body["agents"]) == AGENTS and not body["degraded"]
        assert sorted(body["individual_answers"]) == AGENTS
        assert {"predicted_answer", "votes", "latency_ms"} <= set(body)
    finally:
        serve.shutdown()
        ray.shutdown()
    assert load_tokenizer(trained / "agent_a0" / "stage_0").eos_token == "<|im_end|>"
