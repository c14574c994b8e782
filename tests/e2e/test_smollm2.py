"""A real pretrained model end to end: SmolLM2-135M-Instruct (`builtin:smollm2-135m`).

- Both rollout engines end a response at `<|im_end|>` and the reward reads its `\\boxed{}`.
- After a weight sync from the learner, both engines score tokens as the learner does and
  decode greedily alike.
- `satseq train configs/smollm2.yaml` runs a SAT-Seq stage with two agents (hf rollouts, for
  memory: see TINY_RUN); its HF directories load in transformers and vLLM, and `satseq eval`
  and `satseq serve` answer with them.

The `satseq` commands run as subprocesses, as a user runs them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from satseq.actors.engines import make_engine
from satseq.actors.learner import Learner, LearnerSpec
from satseq.actors.trajectory import SamplingSpec, Trajectory
from satseq.data import PromptFormat, make_split
from satseq.data.prompts import prompt_ids
from satseq.models import resolve_model_path
from satseq.rewards.scorer import RewardScorer
from tests.actors.test_engines import engine_logprobs, perturb_
from tests.cluster.runs import free_port

# one SmolLM2 team at a time, on one xdist worker: each needs most of a worker's memory
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

ROOT = Path(__file__).resolve().parents[2]
SATSEQ = str(Path(sys.executable).parent / "satseq")
CONFIG = ROOT / "configs" / "smollm2.yaml"
GRPO_CONFIG = ROOT / "configs" / "smollm2_grpo.yaml"
SMOLLM2 = "builtin:smollm2-135m"
KINDS = ("hf", "vllm")
# A prompt SmolLM2 answers greedily with a boxed number and stops.
CALCULATOR = PromptFormat(
    answer_instruction="", system_prompt="You are a calculator. Reply only with \\boxed{result}."
)
# Small enough for a test: one stage, two prompts, two samples each, short responses. The
# rollouts use the hf engine, which needs no KV-cache reservation: with it the test run peaks
# near 15 GB on the machine (two learners at ~32 bytes per parameter beside this process's own
# models); the full config with vLLM peaks at 17.4 GB (README). vLLM is checked above (weight
# sync) and below (loading the output).
TINY_RUN = [
    "trainer.stages=1",
    "trainer.batch_size=2",
    "sat_seq.group_size=2",
    "rollout.max_new_tokens=24",
    "rollout.engine=hf",
    "rollout.dynamic_sampling.max_rounds=2",  # the config draws up to 6 rounds of prompts
    "trainer.val_every=0",
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return resolve_model_path(SMOLLM2)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def im_end(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids("<|im_end|>")


@pytest.fixture(scope="class")
def learner(model_dir) -> Learner:
    return Learner(LearnerSpec(model_path=str(model_dir), agent_index=0, dtype="float32"))


@pytest.fixture(scope="class")
def base_weights(learner) -> dict[str, torch.Tensor]:
    """The checkpoint's weights, before any test perturbs the learner."""
    return learner.weights()


@pytest.fixture(scope="class")
def engines(model_dir):
    started = {kind: make_engine(kind, model_dir, seed=0) for kind in KINDS}
    yield started
    for engine in started.values():
        engine.close()


def problem_prompts(tokenizer, prompt_format: PromptFormat, n: int) -> list[list[int]]:
    return [prompt_ids(tokenizer, p, prompt_format) for p in make_split("test", n, style="words")]


class TestEngines:
    """Both engines and a learner in this process; class-scoped, so their memory (~3 GB) is
    freed before the training run below starts its own."""

    @pytest.mark.parametrize("kind", KINDS)
    def test_a_response_ends_at_im_end_and_the_reward_reads_its_box(
        self, kind, engines, base_weights, tokenizer, im_end
    ):
        engine = engines[kind]
        engine.load_weights(base_weights)
        prompts = problem_prompts(tokenizer, CALCULATOR, 4)
        samples = engine.generate(prompts, SamplingSpec(temperature=0.0, max_new_tokens=48))
        scorer = RewardScorer()
        boxed = 0
        for (sample,) in samples:
            assert sample.finish_reason == "stop" and sample.token_ids[-1] == im_end
            assert im_end not in sample.token_ids[:-1]
            text = tokenizer.decode(sample.token_ids, skip_special_tokens=True)
            assert "<|im_end|>" not in text and "<|im_start|>" not in text
            answer = scorer.extract_answer(text)
            if answer is not None:
                boxed += 1
                assert scorer.score("", text, answer) == 1.0
                assert scorer.score("", text, f"{answer}1") == 0.0
        assert boxed >= 2, "SmolLM2 asked for only a box wrote too few"

    def test_synced_engines_score_like_the_learner_and_decode_alike(
        self, engines, learner, base_weights, tokenizer
    ):
        prompts = problem_prompts(tokenizer, PromptFormat(), 3)
        responses = ["Seven plus twelve is 19, so the answer is \\boxed{19}.", "I think 5.", "42"]
        trajectories = [
            Trajectory(i, prompt, ids, [1] * len(ids), [0] * len(ids), finish_reason="stop")
            for i, (prompt, text) in enumerate(zip(prompts, responses, strict=True))
            for ids in [tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)]
        ]
        sequences = [t.prompt_ids + t.response_ids for t in trajectories]
        starts = [len(t.prompt_ids) for t in trajectories]
        greedy = SamplingSpec(temperature=0.0, max_new_tokens=24)

        learner.policy.model.load_state_dict(base_weights)
        perturb_(learner.policy.model, seed=1, scale=2e-3)  # as a few optimiser steps would
        expected = learner.logprobs(trajectories)
        mask = torch.zeros_like(expected, dtype=torch.bool)
        for row, t in enumerate(trajectories):
            mask[row, : len(t.response_ids)] = True
        decoded = {}
        for kind, engine in engines.items():
            engine.load_weights(base_weights)
            before = engine_logprobs(engine, sequences, starts, 1.0)
            engine.load_weights(learner.weights())
            after = engine_logprobs(engine, sequences, starts, 1.0)
            assert (after - expected[mask]).abs().max() < 1e-3, kind
            assert (after - before).abs().max() > 1e-2, f"{kind}: the sync changed nothing"
            decoded[kind] = [s[0].token_ids for s in engine.generate(prompts, greedy)]
        assert decoded["hf"] == decoded["vllm"]


def satseq(*args: str, timeout: float) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [SATSEQ, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One SAT-Seq stage of configs/smollm2.yaml with two agents, shrunk to test size."""
    out = tmp_path_factory.mktemp("smollm2-run")
    overrides = [arg for key in TINY_RUN for arg in ("--set", key)]
    satseq("train", str(CONFIG), "--output-dir", str(out), *overrides, timeout=600)
    return out


def test_a_sat_seq_stage_writes_metrics_and_loadable_agents(trained, im_end):
    (metrics,) = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert metrics["stage"] == 0
    for name in ("a0", "a1"):
        directory = trained / f"agent_{name}" / "stage_0"
        model = AutoModelForCausalLM.from_pretrained(directory)
        assert model.config.model_type == "llama" and model.num_parameters() == 134_515_008
        tokenizer = AutoTokenizer.from_pretrained(directory)
        assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template is not None
        engine = make_engine("vllm", directory, seed=0)
        try:
            prompt = problem_prompts(tokenizer, CALCULATOR, 1)
            (sample,) = engine.generate(prompt, SamplingSpec(temperature=0.0))[0]
            assert sample.finish_reason == "stop" and sample.token_ids[-1] == im_end
        finally:
            engine.close()


def test_a_grpo_stage_of_the_baseline_config_updates_and_saves_each_agent(tmp_path):
    """configs/smollm2_grpo.yaml, the learning benchmark's baseline (the same two agents, each
    trained alone by GRPO on its own groups), one stage shrunk as TINY_RUN: every agent's
    update is logged and its HF directory saved."""
    shrunk = [key for key in TINY_RUN if not key.startswith("sat_seq.")] + ["grpo.group_size=2"]
    overrides = [arg for key in shrunk for arg in ("--set", key)]
    satseq("train", str(GRPO_CONFIG), "--output-dir", str(tmp_path), *overrides, timeout=600)
    (metrics,) = [
        json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert metrics["stage"] == 0 and metrics["groups/degenerate_fraction"] >= 0
    for name in ("a0", "a1"):
        assert f"reward/mean/{name}" in metrics
        directory = tmp_path / f"agent_{name}" / "stage_0"
        assert AutoModelForCausalLM.from_pretrained(directory).num_parameters() == 134_515_008


def test_eval_scores_the_trained_team(trained, tmp_path):
    out = tmp_path / "eval"
    satseq(
        "eval",
        "--dataset",
        "synthetic:test",
        "--checkpoint-dir",
        str(trained),
        "--output-dir",
        str(out),
        "--samples-per-agent",
        "1",
        "--set",
        "eval.synthetic_problems=3",
        "--set",
        "eval.max_new_tokens=32",
        timeout=600,
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_problems"] == 3 and sorted(summary["per_agent"]) == ["a0", "a1"]
    predictions = (out / "predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 3
    assert all(sorted(json.loads(p)["individual_answers"]) == ["a0", "a1"] for p in predictions)


def test_serve_answers_predict_with_the_trained_team(trained):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "SATSEQ_API_KEY"}  # no key needed
    command = [SATSEQ, "serve", "--checkpoint-dir", str(trained), "--port", str(port)]
    server = subprocess.Popen(
        [*command, "--set", "serve.max_tokens=32"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(server, url, timeout=300)
        reply = httpx.post(
            f"{url}/predict", json={"problem": "What is seven plus 12?"}, timeout=120
        )
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert sorted(body["agents"]) == ["a0", "a1"] and not body["degraded"]
        assert sorted(body["individual_answers"]) == ["a0", "a1"]
    finally:
        server.send_signal(signal.SIGINT)  # `satseq serve` shuts Serve down on Ctrl-C
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def wait_until_healthy(server: subprocess.Popen, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).json().get("status") == "ok":
                return
        except (httpx.TransportError, ValueError):
            pass
        assert server.poll() is None, server.stdout.read()[-3000:]
        assert time.monotonic() < deadline, f"satseq serve was not healthy in {timeout} s"
        time.sleep(1)
