"""The rollout actor: one inference engine per agent, in one process (design §3 step 2); the
LoRA agents on one base share one engine (`satseq.actors.engines.lora`, design §12).

`RolloutWorker` is the plain class, usable in-process; `RolloutActor` is the same class as a
Ray actor. Give each actor a readable name in the Ray dashboard and logs when starting it:

    rollout = RolloutActor.options(name="rollout-0").remote(
        {"solver": "outputs/exp/agent_solver/stage_3", "checker": "builtin:tiny"},
        engine="vllm", engine_options={"max_model_len": 1024}, seed=0,
    )
    generations = ray.get(rollout.generate.remote([("solver", prompt_ids, 4)], spec))

With `tools` enabled (and a `sandbox`: a SandboxPool actor handle, or an in-process object with
an async `execute`), every sample runs the agent loop of `tool_loop.ToolLoop` (design §5).
With a `scorer`, the samples of a request that carries a `Reference` come back with their text
and reward: rewards are computed where the rollout happens (design §3 step 3).

On GPUs shared with the learners, `sleep()` frees the engines' memory while the learners train and
`wake_up()` takes it back before the next generation; weights pushed in between wait for it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any

import ray
import torch

from satseq.actors.calls import ActorCalls, RayCalls
from satseq.actors.engines import Engine, EngineKind
from satseq.actors.engines.lora import LoraAgentEngine, replace_engine, team_engines
from satseq.actors.incarnation import PROCESS_ID
from satseq.actors.residency import return_free_host_memory
from satseq.actors.tool_loop import SandboxClient, ToolLoop
from satseq.actors.trajectory import GenerateFn, Generation, GenerationRequest, SamplingSpec
from satseq.config.rollout import ToolConfig
from satseq.models import load_tokenizer
from satseq.rewards import RewardScorer
from satseq.seeds import agent_seed, call_seed, worker_seed


class RolloutWorker:
    """Samples from each agent's current policy and takes each agent's new weights.

    Agent k's engine is seeded `agent_seed(seed, k)` (k in `agent_paths` order), so agents that
    start from the same checkpoint still draw different samples.
    """

    def __init__(
        self,
        agent_paths: dict[str, str],
        engine: EngineKind = "hf",
        engine_options: dict[str, Any] | None = None,
        seed: int = 0,
        tools: ToolConfig | None = None,
        sandbox: Any = None,
        scorer: RewardScorer | None = None,
    ) -> None:
        if not agent_paths:
            raise ValueError("a rollout worker needs at least one agent")
        use_tools = tools is not None and tools.enabled
        if use_tools and sandbox is None:
            raise ValueError("tool-augmented rollouts need a sandbox to run the model's code")
        self.engine_kind = engine
        self.engine_options = engine_options or {}
        self.seeds = {name: agent_seed(seed, k) for k, name in enumerate(agent_paths)}
        self.engines: dict[str, Engine] = team_engines(
            engine, agent_paths, self.seeds, self.engine_options
        )
        self.tokenizers = {name: load_tokenizer(path) for name, path in agent_paths.items()}
        self.asleep = False
        self.pending_weights: dict[str, list[dict[str, torch.Tensor]]] = {}  # pushed while asleep
        self.tools = tools if use_tools else None
        self.scorer = scorer
        self.sandbox: SandboxClient | None = None
        self.tool_loops: dict[str, ToolLoop] = {}
        if use_tools:
            self.sandbox = SandboxClient(sandbox)
            self.tool_loops = {
                name: ToolLoop(self.engines[name], self.tokenizers[name], self.sandbox, tools)
                for name in agent_paths
            }

    def ready(self) -> dict[str, Any]:
        """Returns once every engine has started: {"engine": kind, "agents": names}."""
        return {"engine": self.engine_kind, "agents": list(self.engines)}

    def incarnation(self) -> str:
        """The process this worker runs in: a new one after Ray restarted it (with every engine
        on its initial weights)."""
        return PROCESS_ID

    def generate(
        self, requests: list[GenerationRequest], spec: SamplingSpec
    ) -> list[list[Generation]]:
        """result[r] holds the n samples of requests[r] (scored where it has a reference).

        Requests go to their agent's engine in one call per (engine, n), in first-seen order (the
        LoRA agents sharing an engine in one call, each prompt with its agent's adapter); with
        tools, to their agent's tool loop in one call per agent (the loop takes each prompt's
        own n). With `spec.seed` set, the k-th such call is seeded
        `call_seed(spec.seed, k)`, so calls do not share random draws and the same requests with
        the same seed give the same samples.
        """
        if self.asleep:
            raise RuntimeError("the rollout worker is asleep: call wake_up() before generate()")
        requests = [GenerationRequest(*request) for request in requests]
        groups: dict[tuple[Any, int | None], list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            engine = self._engine(request.agent)
            if self.tool_loops:
                groups[(request.agent, None)].append(index)
            elif isinstance(engine, LoraAgentEngine):
                groups[(engine.shared, request.n)].append(index)
            else:
                groups[(request.agent, request.n)].append(index)
        results: list[list[Generation]] = [[] for _ in requests]
        for k, ((target, n), indices) in enumerate(groups.items()):
            call_spec = replace(spec, seed=call_seed(spec.seed, k))
            prompts = [requests[index].prompt_ids for index in indices]
            if n is None:
                counts = [requests[index].n for index in indices]
                samples = self.tool_loops[target].generate(prompts, call_spec, counts)
            elif isinstance(target, str):
                samples = self.engines[target].generate(prompts, call_spec, n)
            else:  # LoRA agents on one engine: each prompt with its agent's adapter
                adapters = [requests[index].agent for index in indices]
                samples = target.engine.generate(prompts, call_spec, n, adapters=adapters)
            for index, request_samples in zip(indices, samples, strict=True):
                results[index] = request_samples
        scored = self._scored(requests, results)
        # the engine's and the scorer's transient buffers, which the C allocator would keep
        # through the learners' phases that follow (0.35 GB of a SmolLM2 LoRA team's engine)
        return_free_host_memory()
        return scored

    def _scored(
        self, requests: list[GenerationRequest], results: list[list[Generation]]
    ) -> list[list[Generation]]:
        """The samples of requests with a reference, with their text and 0/1 reward (math-verify
        or the config's reward function), scored as one batch."""
        to_score = [
            (r, j)
            for r, request in enumerate(requests)
            if request.reference is not None
            for j in range(len(results[r]))
        ]
        if not to_score:
            return results
        if self.scorer is None:
            raise ValueError("requests with a reference need a rollout worker with a scorer")
        texts = [
            self.tokenizers[requests[r].agent].decode(
                results[r][j].token_ids, skip_special_tokens=True
            )
            for r, j in to_score
        ]
        scores = self.scorer.score_batch(
            [requests[r].reference.problem for r, _ in to_score],
            texts,
            [requests[r].reference.answer for r, _ in to_score],
        )
        results = [list(samples) for samples in results]
        for (r, j), text, reward in zip(to_score, texts, scores.scores, strict=True):
            results[r][j] = replace(results[r][j], text=text, reward=float(reward))
        return results

    def load_weights(self, agent_name: str, weights: dict[str, torch.Tensor]) -> None:
        """Push learner weights (all of them or one bucket of a streamed sync) into
        `agent_name`'s engine in place (while asleep: on `wake_up`, in the order they came,
        since a sleeping engine cannot take weights)."""
        engine = self._engine(agent_name)  # an unknown agent fails now, not on waking
        if self.asleep:
            self.pending_weights.setdefault(agent_name, []).append(weights)
        else:
            engine.load_weights(weights)

    def init_weight_transfer(self, agent_name: str, init_info: dict[str, Any]) -> None:
        """`agent_name`'s engine joins its learner's weight-transfer group (a collective weight
        sync, `satseq.actors.weight_transfer`)."""
        self._transfer_engine(agent_name).init_weight_transfer(init_info)

    def receive_weights(self, agent_name: str, update_info: dict[str, Any]) -> None:
        """`agent_name`'s engine takes the weights its learner broadcasts now."""
        self._transfer_engine(agent_name).receive_weights(update_info)

    def _transfer_engine(self, agent_name: str) -> Any:
        engine = self._engine(agent_name)
        if not hasattr(engine, "receive_weights"):
            raise ValueError(
                f"the {self.engine_kind} engine takes weights through the object store only; "
                "a collective weight sync (rollout.weight_sync: collective) needs vllm"
            )
        if self.asleep:
            raise RuntimeError("an engine takes a collective weight sync only while awake")
        return engine

    def sleep(self) -> dict[str, str]:
        """Every engine frees its accelerator memory until `wake_up` (`Engine.sleep`). Returns
        what ran, per agent ({} when already asleep)."""
        if self.asleep:
            return {}
        self.asleep = True
        return {name: engine.sleep() for name, engine in self.engines.items()}

    def wake_up(self) -> dict[str, str]:
        """Every engine takes its memory back, then the weights pushed while it slept. Returns
        what ran, per agent ({} when already awake)."""
        if not self.asleep:
            return {}
        woken = {name: engine.wake_up() for name, engine in self.engines.items()}
        self.asleep = False
        for name, buckets in self.pending_weights.items():
            for weights in buckets:
                self.engines[name].load_weights(weights)
        self.pending_weights = {}
        return woken

    def replace_agent(self, agent_name: str, path: str) -> None:
        """A swap: `agent_name`'s engine (and tool loop) rebuilt on the model at `path`, with the
        agent's seed; the old engine is closed. Its weights then come from the new learner."""
        self._engine(agent_name)  # an unknown agent fails here
        self.engines[agent_name] = replace_engine(
            self.engines,
            self.engine_kind,
            agent_name,
            path,
            self.seeds[agent_name],
            self.engine_options,
        )
        self.pending_weights.pop(agent_name, None)  # the old model's
        if self.asleep:
            self.engines[agent_name].sleep()
        self.tokenizers[agent_name] = load_tokenizer(path)
        if self.tools is not None:
            self.tool_loops[agent_name] = ToolLoop(
                self.engines[agent_name], self.tokenizers[agent_name], self.sandbox, self.tools
            )

    def _engine(self, agent: str) -> Engine:
        if agent not in self.engines:
            raise KeyError(
                f"no agent {agent!r} in this rollout worker; it holds {sorted(self.engines)}"
            )
        return self.engines[agent]

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
        if self.sandbox is not None:
            self.sandbox.close()
        if self.scorer is not None:
            self.scorer.close()


RolloutActor = ray.remote(RolloutWorker)


def spread_requests(workers: list, calls: ActorCalls | None = None) -> GenerateFn:
    """A `generate(requests, spec)` that deals requests round-robin over rollout workers (Ray
    actors by default; plain `RolloutWorker`s with `InProcessCalls`) and returns the results in
    request order; a seeded spec is offset per worker."""
    calls = calls or RayCalls()

    def generate(requests: list[GenerationRequest], spec: SamplingSpec) -> list[list[Generation]]:
        n = len(workers)
        specs = [replace(spec, seed=worker_seed(spec.seed, j)) for j in range(n)]
        shards = calls.wait(
            [
                calls.start(worker, RolloutWorker.generate, requests[j::n], specs[j])
                for j, worker in enumerate(workers)
            ]
        )
        return [shards[r % n][r // n] for r in range(len(requests))]

    return generate
