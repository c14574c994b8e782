"""One agent of the served team: its engine behind a Ray Serve deployment (design §7); or the
LoRA agents on one base behind one deployment, sharing one engine that holds every adapter
(`satseq.actors.engines.lora`, design §12).

`AgentModel` is the plain class (the benchmark calls it in-process); `AgentDeployment` serves
it: the requests that arrive while its engine works go to the engine together, in as few calls
as their sampling parameters allow (`satseq.serving.batching`), off the replica's event loop
so that health checks answer during generation.

With `tools` enabled each sample runs the tool loop of training (design §5, `ToolLoop`), with
the same limits: `rollout.tools` (turns, tool output length), the request's max_tokens for model
and tool tokens together, and the `sandbox:` section. Each replica starts its own SandboxPool
actor, which lives and dies with it, so a graph deployed by `serve run` or a RayService needs
nothing started beside it.
"""

from __future__ import annotations

import importlib.util
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import torch
from ray import serve

from satseq.actors.engines import Engine, EngineKind, make_engine
from satseq.actors.engines.lora import team_engines
from satseq.actors.tool_loop import SandboxClient, ToolLoop, tool_turns
from satseq.actors.trajectory import Generation, SamplingSpec
from satseq.config.rollout import SandboxConfig, ToolConfig
from satseq.launch.actors import start_sandbox_pool
from satseq.models import load_tokenizer
from satseq.rewards import RewardScorer
from satseq.serving.batching import EngineBatcher

AgentRequest = tuple[list[int], int, SamplingSpec]
"""(prompt token ids, number of samples, how to sample)."""

ServeEngine = Literal["auto", "hf", "vllm"]
"""`serve.engine`: an engine kind, or auto (`replica_engine`)."""

# Requests answered together: bounded so that one batch's latency stays bounded.
MAX_BATCH_SIZE = 32
# Serve's controller learns that a replica's process died from its next health check (the
# check's call fails at once), so the period (Serve's default: 10 s) bounds how long a dead
# replica goes unnoticed before its replacement starts. A live replica answers the check from
# its event loop (generation runs off it); one that misses three in a row is replaced.
HEALTH_CHECK_PERIOD_S = 1.0
HEALTH_CHECK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class AgentAnswers:
    """An agent's n samples of one request: the extracted answers (None: no answer found),
    the samples' log-probabilities, how long the engine call that made them took, how many
    requests that call answered, each sample's trajectory (`sample_trajectory`: its text
    and tool turns), and each sample's number of new tokens."""

    answers: list[str | None]
    logprobs: list[float | None]
    generation_s: float
    batch_size: int
    trajectories: list[dict[str, Any]]
    completion_tokens: list[int]

    def samples(self, first: int, count: int) -> AgentAnswers:
        """Samples first … first + count − 1 alone: one of several votes asked in one call."""
        chosen = slice(first, first + count)
        return replace(
            self,
            answers=self.answers[chosen],
            logprobs=self.logprobs[chosen],
            trajectories=self.trajectories[chosen],
            completion_tokens=self.completion_tokens[chosen],
        )


class AgentModel:
    """One agent's engine on its HF model dir: prompt token ids in, extracted answers out.
    With `tools` enabled, a `sandbox` (a SandboxPool actor handle, or an in-process object with
    an async `execute`) runs the model's code in the tool loop. `built_engine`: an engine made
    already (a LoRA agent's, on the engine it shares), instead of one on `model_path`."""

    def __init__(
        self,
        model_path: str,
        scorer: RewardScorer,
        engine: EngineKind = "hf",
        engine_options: dict[str, Any] | None = None,
        seed: int = 0,
        tools: ToolConfig | None = None,
        sandbox: Any = None,
        built_engine: Engine | None = None,
    ) -> None:
        if tools is not None and tools.enabled and sandbox is None:
            raise ValueError("an agent with tools needs a sandbox to run the model's code")
        self.engine = built_engine or make_engine(
            engine, model_path, seed=seed, **(engine_options or {})
        )
        self.tokenizer = load_tokenizer(model_path)
        self.scorer = scorer
        self.sandbox: SandboxClient | None = None
        self.tool_loop: ToolLoop | None = None
        if tools is not None and tools.enabled:
            self.sandbox = SandboxClient(sandbox)
            self.tool_loop = ToolLoop(self.engine, self.tokenizer, self.sandbox, tools)

    def answer(self, requests: Sequence[AgentRequest]) -> list[AgentAnswers]:
        """answers[i] for requests[i]; one engine call per distinct (n, spec)."""
        groups: dict[tuple[int, SamplingSpec], list[int]] = defaultdict(list)
        for index, (_, n, spec) in enumerate(requests):
            groups[(n, spec)].append(index)
        results: list[AgentAnswers | None] = [None] * len(requests)
        for (n, spec), indices in groups.items():
            started = time.perf_counter()
            prompts = [requests[i][0] for i in indices]
            if self.tool_loop is not None:
                samples = self.tool_loop.generate(prompts, spec, [n] * len(prompts))
            else:
                samples = self.engine.generate(prompts, spec, n)
            elapsed = time.perf_counter() - started
            for index, generations in zip(indices, samples, strict=True):
                texts = [
                    self.tokenizer.decode(g.token_ids, skip_special_tokens=True)
                    for g in generations
                ]
                answers = [self.scorer.extract_answer(text) for text in texts]
                results[index] = AgentAnswers(
                    answers,
                    [g.logprob for g in generations],
                    elapsed,
                    len(indices),
                    [
                        self.sample_trajectory(g, text, answer)
                        for g, text, answer in zip(generations, texts, answers, strict=True)
                    ],
                    [len(g.token_ids) for g in generations],
                )
        return results

    def sample_trajectory(
        self, generation: Generation, text: str, answer: str | None
    ) -> dict[str, Any]:
        """What /predict returns of a sample with `return_trajectories`: its response text, its
        answer, why it ended, the sandbox's status of each code run, and its turns (what the
        model wrote, the code it ran, the interpreter output it read back)."""
        return {
            "response": text,
            "answer": answer,
            "finish_reason": generation.finish_reason,
            "tool_statuses": list(generation.meta.get("tool_statuses", [])),
            "turns": [
                asdict(turn)
                for turn in tool_turns(
                    generation, lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)
                )
            ],
        }

    def close(self) -> None:
        self.engine.close()
        if self.sandbox is not None:
            self.sandbox.close()


def replica_engine(kind: ServeEngine, options: dict[str, Any]) -> tuple[EngineKind, dict]:
    """The engine a replica serves with and its options: `serve.engine`, where `auto` is vLLM
    when the replica sees a GPU (its `ray_actor_options` asked for one) and vLLM is installed,
    else hf; and `serve.dtype` (`options["dtype"]`), where `auto` is bfloat16 on a GPU and
    float32 on the CPU (the output layer stays float32 with `fp32_head`)."""
    gpu = torch.cuda.is_available()
    if kind == "auto":
        kind = "vllm" if gpu and importlib.util.find_spec("vllm") is not None else "hf"
    if options.get("dtype", "auto") == "auto":
        options = {**options, "dtype": "bfloat16" if gpu else "float32"}
    return kind, options


@serve.deployment(
    max_ongoing_requests=64,
    health_check_period_s=HEALTH_CHECK_PERIOD_S,
    health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
)
class AgentDeployment:
    """Serves one AgentModel (`model_path` a directory), or the LoRA agents on one base
    (`model_path` agent name → adapter directory, `seed` per agent) on one engine. Scaling
    (num_replicas, autoscaling) comes from configs/serve.yaml. With `tools` enabled the replica
    starts a SandboxPool actor on `sandbox`, its own."""

    def __init__(
        self,
        model_path: str | dict[str, str],
        scorer: RewardScorer,
        engine: ServeEngine,
        engine_options: dict[str, Any],
        seed: int | dict[str, int],
        tools: ToolConfig | None = None,
        sandbox: SandboxConfig | None = None,
    ) -> None:
        use_tools = tools is not None and tools.enabled
        # owned by this replica's process, so Ray ends it with the replica
        self.sandbox = start_sandbox_pool(sandbox or SandboxConfig()) if use_tools else None
        engine, engine_options = replica_engine(engine, engine_options)
        common = (scorer, engine, engine_options)
        if isinstance(model_path, str):  # one agent, whatever the ingress calls it
            self.models = {None: AgentModel(model_path, *common, seed, tools, self.sandbox)}
        else:
            engines = team_engines(engine, model_path, seed, engine_options)
            self.models = {
                name: AgentModel(path, *common, seed[name], tools, self.sandbox, engines[name])
                for name, path in model_path.items()
            }
        # one batch at a time: the engine is never shared
        self.batcher = EngineBatcher(self.answer_batch, MAX_BATCH_SIZE)

    def answer_batch(self, requests: list[tuple[str | None, AgentRequest]]) -> list[AgentAnswers]:
        """answers[i] for requests[i] = (agent, request), each agent's requests together."""
        by_agent: dict[str | None, list[int]] = defaultdict(list)
        for index, (agent, _) in enumerate(requests):
            by_agent[agent if agent in self.models else None].append(index)
        results: list[AgentAnswers | None] = [None] * len(requests)
        for agent, indices in by_agent.items():
            answers = self.models[agent].answer([requests[i][1] for i in indices])
            for index, answer in zip(indices, answers, strict=True):
                results[index] = answer
        return results

    async def ready(self) -> bool:
        return True

    async def answer(
        self, prompt_ids: list[int], n: int, spec: SamplingSpec, agent: str | None = None
    ) -> AgentAnswers:
        """`agent`'s answers (the deployment's only agent's when it serves one)."""
        return await self.batcher.submit((agent, (prompt_ids, n, spec)))
